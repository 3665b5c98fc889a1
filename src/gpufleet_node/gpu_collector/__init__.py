"""gpufleet GPU textfile collector for node_exporter (stdlib only, Python 3.9+).

Each cycle runs one ``nvidia-smi --query-gpu`` and one ``--query-compute-apps`` (or
``amd-smi``/``rocm-smi`` JSON), reads new XID lines from the kernel log, maps compute
processes to Slurm jobs through their cgroup, and writes ``node_gpu_*`` series atomically
into node_exporter's textfile directory. See docs/gpu-collector.md.

Modules: ``model`` (limits, GpuData, families), ``values``, ``nvidia`` and ``amd``
(parsers), ``health`` (XID, device minors), ``slurm`` (job attribution), ``metrics``,
``run`` (bounded commands, textfile), ``state``, ``query`` (vendor tool runs), ``xid``
(kernel-log sources), ``collect`` (the cycle), ``service`` (loop, systemd notify), ``cli``.
"""
