"""gpufleet Slurm exporter: Slurm state as Prometheus metrics, GPU allocation per job.

Slurm is read through its commands (sinfo, squeue, scontrol, sdiag, sshare) in a background
thread every ``--collect-interval`` seconds, each command bounded by ``--command-timeout``
(its whole process group is killed on timeout). A scrape of ``/metrics`` only serves the
latest snapshot, so a hung slurmctld never blocks a scrape. A Prometheus shard asks for its
own nodes only (``/metrics?shard=K``, nodes from ``--node-map-file``); one shard also for
the cluster-level series (``&cluster=1``); no query serves everything.

Metric names follow SckyzO/slurm_exporter (which kept the vpenso names) so existing Slurm
dashboards work; the additions are documented in docs/slurm-exporter.md.

Layout: model (commands, bounds, data) -> parsers (one pure module per command output) ->
metrics (pure families) -> shards (pure per-shard selection) -> collect (the thread) ->
server (HTTP) -> cli.
"""
