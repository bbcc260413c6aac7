"""Text users wrote (job names, reasons, comments, partitions), made safe to print.

Such text reaches log lines, events and the admin's terminal: control characters could
forge log lines or move the cursor, and a 10 kB name would flood both.
"""

from __future__ import annotations


def printable(text: str, limit: int) -> str:
    """``text`` with every non-printable character as ``?``, at most ``limit`` long."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: max(0, limit - 3)] + "..."
