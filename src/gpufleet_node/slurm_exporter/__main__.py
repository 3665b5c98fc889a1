"""``python -m gpufleet_node.slurm_exporter`` and the zipapp's entry point."""

import sys

from gpufleet_node.slurm_exporter.cli import main

if __name__ == "__main__":
    sys.exit(main())
