"""A reader that follows the seqlock never sees a half-written record, while the writer
steps and pauses as fast as it can (the reader is a separate process, as the agent is)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hyperpod_agent import progress

from .conftest import REPO

READER = """
import json, os, sys, time
from pathlib import Path
from hyperpod_agent.progress import format as fmt

path, ready, done, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
want = int(sys.argv[5])
fd = os.open(path, os.O_RDONLY)
seen, retries, changes, errors, last = 0, 0, 0, [], None
deadline = time.monotonic() + 60
while time.monotonic() < deadline and len(errors) < 5:
    if (seen + retries) % 256 == 0 and stop.exists():
        break
    first = fmt.SEQ.unpack(os.pread(fd, 4, fmt.SEQ_OFFSET))[0]
    data = os.pread(fd, fmt.SIZE, 0)
    after = fmt.SEQ.unpack(os.pread(fd, 4, fmt.SEQ_OFFSET))[0]
    before = fmt.SEQ.unpack_from(data, fmt.SEQ_OFFSET)[0]
    if before % 2 or not first == before == after:
        retries += 1
        continue
    r = fmt.decode(data)
    seen += 1
    # What the writer keeps true at every step (see the test): a torn copy breaks it.
    if r.total != r.step or len(r.durations) != min(r.total, fmt.RING):
        errors.append(f"step {r.step} total {r.total} durations {len(r.durations)}")
    if r.paused != (r.pause_reason == f"p{r.step}") or (r.paused and not r.pause_since > 0):
        errors.append(f"step {r.step} paused {r.paused} {r.pause_reason!r} {r.pause_since}")
    if last is not None and (r.step < last.step or r.step_at < last.step_at):
        errors.append(f"went back: step {last.step} -> {r.step}")
    if last is not None and r.step != last.step:
        changes += 1
    last = r
    if seen == 1:
        ready.touch()
    if changes >= want:
        break
done.touch()
print(json.dumps({"seen": seen, "retries": retries, "changes": changes, "errors": errors}))
"""


def test_a_concurrent_reader_never_sees_a_torn_record(job: Path, tmp_path: Path) -> None:
    progress.step(0)
    ready, done, stop = tmp_path / "ready", tmp_path / "done", tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(job), str(ready), str(done), str(stop), "5000"],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists(), "the reader never read the record"
        n = 0
        while n < 50_000_000 and time.monotonic() < deadline:
            n += 1
            progress.step(n)
            if n % 1000 == 0:  # a phase between two steps, as an evaluation would be
                progress.pause(f"p{n}")
                progress.resume()
                if done.exists():
                    break
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
        reader.wait(timeout=30)
    result = json.loads(out)
    assert result["errors"] == []
    assert result["changes"] >= 5000, result
