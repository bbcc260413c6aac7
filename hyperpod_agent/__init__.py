"""hyperpod-agent: HyperPod-grade resilience for any Slurm GPU cluster."""

__version__ = "0.2.0.dev0"
