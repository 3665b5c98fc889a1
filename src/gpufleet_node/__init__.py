"""gpufleet node-side programs (Slurm exporter; next, the GPU collector).

Standard library only, Python 3.9 floor: EL 9's system python3 runs these on the nodes,
shipped as one zipapp built by :mod:`gpufleet_node.build`.
"""

__version__ = "0.1.0"
