"""gpufleet: node list inventory, shard planner and roles for GPU cluster monitoring."""

__version__ = "0.1.0"
