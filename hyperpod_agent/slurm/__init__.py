"""Slurm adapter: the only code that runs Slurm commands."""
