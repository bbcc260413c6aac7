"""Hangs and stragglers: the judgement (judge.py) and the actions it leads to (plan.py)."""
