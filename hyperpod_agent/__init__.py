"""hyperpod-agent: HyperPod-grade resilience for any Slurm GPU cluster."""

__version__ = "0.1.0"
