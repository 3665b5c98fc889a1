"""Job summaries that outlive Prometheus' retention (docs/jobstats.md).

A slurmctld epilog (``EpilogSlurmctld``) asks the Prometheus instances holding a finished
job's series for the figures ``gpufleet jobstats`` shows and stores them, compressed, in
the job's AdminComment, which slurmdbd keeps as long as its accounting records.
"""
