"""gpufleet-gpu-health: Slurm's HealthCheckProgram over the GPU collector's verdict.

Modules: ``slurmnode`` (scontrol's node JSON), ``decide`` (pure: verdict, intent, the
safety valve, the drain reason), ``cli`` (config, scontrol calls, journal, metrics).
"""
