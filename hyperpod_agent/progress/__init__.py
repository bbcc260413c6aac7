"""This rank's training progress, recorded for the node's agent to read.

The public API (``from hyperpod_agent import progress``; ``progress.step(n)``) is defined
in writer.py; the record's layout is in format.py, and how a record is made safely in
record.py. docs/progress.md has the whole contract.
"""

from hyperpod_agent.progress.writer import close, path, pause, paused, resume, section, step

__all__ = ["close", "path", "pause", "paused", "resume", "section", "step"]
