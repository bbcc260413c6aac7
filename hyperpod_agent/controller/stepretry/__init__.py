"""Step retry inside the allocation: the decision (plan.py) and the surgery (run.py)."""
