"""Deep health checks: real diagnostic tools run before a node takes work again.

A suite (``config.py``) lists checks; the runner (``runner.py``) runs the checks of one
level on this node, each a real tool with its own time limit, and judges each tool's own
output (``parse_*.py``) into OK, FAIL or UNKNOWN. ``python -m hyperpod_agent.deepcheck``
is the entry point a maintenance job runs on every node. See docs/deep-checks.md.
"""
