"""Deep health checks: which nodes to check (plan.py), the check run (run.py), what
a result means (outcomes.py)."""
