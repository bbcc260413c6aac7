"""Checks on the answers to the S3 store's ranged GETs (s3store.py): that an answer holds
exactly the bytes asked for, that the object has the size expected, and how a failed read
is worded when it is retried."""

from __future__ import annotations

import re
from typing import Any

from hyperpod_agent.checkpoint.s3config import MiB
from hyperpod_agent.checkpoint.s3errors import S3Error, S3TruncatedError

CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
READ_CHUNK = MiB  # urllib3 reads into a temporary of the size asked for, then copies


def check_answer(uri: str, r: dict[str, Any], start: int, ln: int, size: int | None) -> None:
    """The answer to a ranged GET holds exactly the bytes asked for (and the object has the
    expected size); raise naming the object otherwise."""
    cr = r.get("ContentRange")
    length = int(r.get("ContentLength", -1))
    if cr:
        m = CONTENT_RANGE.match(str(cr))
        if not m:
            raise S3Error(uri, f"unparsable Content-Range {cr!r}")
        a, b, total = int(m.group(1)), int(m.group(2)), m.group(3)
        if total != "*":
            check_total(uri, int(total), size, start + ln)
        if a != start or b != start + ln - 1:
            raise S3TruncatedError(uri, f"asked for bytes {start}-{start + ln - 1}, got {a}-{b}")
    elif start != 0 or size is None or length != size:
        # A whole object where a range was asked for: the store ignored the Range header.
        raise S3Error(uri, f"the store ignored the byte range {start}-{start + ln - 1}")
    if length >= 0 and length != ln:
        raise S3TruncatedError(uri, f"asked for {ln} bytes at {start}, the answer has {length}")


def check_total(uri: str, total: int, size: int | None, end: int) -> None:
    if size is not None and total != size:
        raise S3TruncatedError(uri, f"object is {total} bytes, expected {size}")
    if total < end:
        raise S3TruncatedError(uri, f"object is {total} bytes, shorter than {end}")


def reason(err: BaseException) -> str:
    """An S3Error's message without its ``s3://...: `` head."""
    return str(err).split(": ", 1)[-1] if isinstance(err, S3Error) else str(err)
