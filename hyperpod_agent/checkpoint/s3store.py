"""An S3-compatible object store for the persistent checkpoint tier.

``S3Store("s3://bucket/prefix")`` puts, gets, lists and deletes objects under a prefix:

- ``put(name, data)`` uploads a buffer, or several buffers as one object (a rank's leaves),
  without copying them: above ``multipart_threshold`` in parallel parts of ``part_size``,
  each part a view of the caller's memory sent by one ``sendall``. Only a part that spans two
  buffers is assembled (at most ``concurrency`` such parts at a time). A failed multipart
  upload is aborted, so nothing partial is ever visible under the name.
- ``read_into(name, out, offset)`` fills a preallocated buffer from the object with parallel
  ranged GETs, checks each answer's ``Content-Range`` (some stores answer ``200`` instead of
  ``206``; one that ignores the range is refused) and, given ``size``, the object's size.
- ``get`` (small objects), ``size`` (HEAD), ``list_objects`` (paginated), ``list_dirs``, ``delete``
  (batches of 1000).

Each request has a connect and a read timeout and a bounded number of attempts with
exponential back-off and jitter (botocore's standard mode retries 503 SlowDown, 5xx and
connection errors); a body cut short is read again, bounded the same way. Every failure is
one :mod:`s3errors` exception naming ``s3://bucket/key``.

The request bodies over the caller's memory are in s3buffers.py, the checks on ranged
answers in s3download.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hyperpod_agent.checkpoint.s3buffers import ViewBody, byte_view, part_source
from hyperpod_agent.checkpoint.s3config import S3Location, S3Options, make_client
from hyperpod_agent.checkpoint.s3download import READ_CHUNK, check_answer, check_total, reason
from hyperpod_agent.checkpoint.s3errors import (
    S3Error,
    S3ObjectMissingError,
    S3TruncatedError,
    classify,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its name under the store's prefix, its size, and what changes
    when it is replaced (ETag and modification time, as the listing gives them)."""

    name: str
    size: int
    version: tuple[str, str] = ("", "")


class S3Store:
    """Objects under ``s3://bucket/prefix``; see the module docstring."""

    def __init__(self, url: str, options: S3Options | None = None):
        self.location = S3Location.parse(url)
        self.options = options or S3Options()
        self._client, self._session = make_client(self.location, self.options)
        self.endpoint: str = self._client.meta.endpoint_url
        from botocore.exceptions import BotoCoreError, ClientError

        self._errors: tuple[type[BaseException], ...] = (BotoCoreError, ClientError)

    # ---- plumbing -------------------------------------------------------------------------

    def _access_key(self) -> str:
        try:
            creds = self._session.get_credentials()
            return str(creds.access_key) if creds is not None else ""
        except Exception:  # only for a message: never let it hide the real error
            return ""

    def _fail(self, exc: BaseException, name: str) -> S3Error:
        return classify(exc, self.location.uri(name), self.endpoint, self._access_key())

    def _call(self, name: str, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(Bucket=self.location.bucket, **kwargs)
        except self._errors as exc:
            raise self._fail(exc, name) from exc

    def _parallel(self, fn: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
        """``fn`` over ``items`` on ``concurrency`` threads; the first failure cancels the
        rest and is raised once they have stopped."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        # Threads inherit the nice value of the thread that creates them (Linux), so a
        # writer that lowered its priority (see _threads) transfers at that priority.
        pool = ThreadPoolExecutor(
            min(self.options.concurrency, len(items)), thread_name_prefix="hyperpod-s3"
        )
        try:
            futures = [pool.submit(fn, i) for i in items]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in futures if f.done() and f.exception() is not None]
            if failed:
                for f in futures:
                    f.cancel()
                raise failed[0].exception()  # type: ignore[misc]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _backoff(self, attempt: int) -> None:
        time.sleep(min(5.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0))

    # ---- put ------------------------------------------------------------------------------

    def put(
        self,
        name: str,
        data: Buffer | Sequence[Buffer],
        ready: Callable[[int], None] | None = None,
    ) -> int:
        """Store ``data`` (one buffer, or several making one object) as ``name``; return its
        size. The object appears whole or not at all.

        ``ready(end)``, if given, is called before the bytes up to ``end`` are sent and
        returns once they hold their final values: a part is uploaded as soon as the
        staging copy has filled it.
        """
        if isinstance(data, list | tuple):
            segs = [byte_view(d) for d in data]
        else:
            segs = [byte_view(cast("Buffer", data))]
        total = sum(len(s) for s in segs)
        key = self.location.key(name)
        if total <= self.options.multipart_threshold:
            if ready is not None:
                ready(total)
            body = segs[0] if len(segs) == 1 else memoryview(b"".join(segs))  # small: copied
            self._call(name, "put_object", Key=key, Body=ViewBody(body))
            return total
        part = self.options.part_size_for(total)
        starts = list(range(0, total, part))
        upload = self._call(name, "create_multipart_upload", Key=key)["UploadId"]
        try:

            def send(i: int) -> str:
                n = min(part, total - starts[i])
                if ready is not None:
                    ready(starts[i] + n)
                return self._put_part(name, key, upload, i + 1, part_source(segs, starts[i], n))

            etags = self._parallel(send, list(range(len(starts))))
            parts = [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]
            self._call(
                name,
                "complete_multipart_upload",
                Key=key,
                UploadId=upload,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            try:  # leave no invisible parts behind (they cost storage on AWS)
                self._client.abort_multipart_upload(
                    Bucket=self.location.bucket, Key=key, UploadId=upload
                )
            except Exception as exc:
                log.debug("%s: abort of upload %s failed: %s", self.location.uri(name), upload, exc)
            raise
        return total

    def put_if_absent(self, name: str, body: bytes) -> bool:
        """Create a small object unless one exists (``If-None-Match: *``); False if the
        store says it exists. A store without conditional writes (rclone's, older MinIO
        and Ceph) ignores the condition: there this is a plain put, and the caller must
        not rely on it alone to settle a race."""
        try:
            self._client.put_object(
                Bucket=self.location.bucket,
                Key=self.location.key(name),
                Body=body,
                IfNoneMatch="*",
            )
        except self._errors as exc:
            err = self._fail(exc, name)
            if err.code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise err from exc
        return True

    def _put_part(
        self, name: str, key: str, upload: str, number: int, body: Callable[[], Buffer]
    ) -> str:
        data = byte_view(body())
        r = self._call(
            name, "upload_part", Key=key, UploadId=upload, PartNumber=number, Body=ViewBody(data)
        )
        return str(r["ETag"])

    # ---- get ------------------------------------------------------------------------------

    def size(self, name: str) -> int | None:
        """The object's size, or None if there is no such object."""
        try:
            r = self._client.head_object(Bucket=self.location.bucket, Key=self.location.key(name))
        except self._errors as exc:
            err = self._fail(exc, name)
            if err.code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise err from exc
        return int(r["ContentLength"])

    def get(self, name: str) -> bytes:
        """A whole (small) object, e.g. a metadata document."""
        key = self.location.key(name)
        for attempt in range(self.options.max_attempts):
            r = self._call(name, "get_object", Key=key)
            try:
                data: bytes = r["Body"].read()  # urllib3 enforces Content-Length
            except self._errors as exc:
                err = self._fail(exc, name)
                if attempt + 1 >= self.options.max_attempts:
                    raise S3TruncatedError(
                        err.uri, f"{reason(err)} (after {attempt + 1} attempts)", err.code
                    ) from exc
                self._backoff(attempt)
                continue
            return data
        raise AssertionError("unreachable")

    def read_into(self, name: str, out: Buffer, offset: int = 0, size: int | None = None) -> None:
        """Fill ``out`` with the object's bytes from ``offset``, in parallel ranged GETs.

        With ``size``, the object must be exactly that large (the total of Content-Range);
        an object too short for the range raises S3TruncatedError.
        """
        view = byte_view(out)
        if view.readonly:
            raise ValueError("read_into needs a writable buffer")
        n, part = len(view), self.options.part_size
        if n == 0:
            have = self.size(name)
            if have is None:
                raise S3ObjectMissingError(self.location.uri(name), "no such object", "NoSuchKey")
            check_total(self.location.uri(name), have, size, offset)
            return
        starts = list(range(0, n, part))
        self._parallel(
            lambda s: self._read_range(name, view[s : min(n, s + part)], offset + s, size),
            starts,
        )

    def _read_range(self, name: str, dest: memoryview, start: int, size: int | None) -> None:
        uri, key, ln = self.location.uri(name), self.location.key(name), len(dest)
        for attempt in range(self.options.max_attempts):
            r = self._call(name, "get_object", Key=key, Range=f"bytes={start}-{start + ln - 1}")
            body = r["Body"]
            try:
                check_answer(uri, r, start, ln, size)
                got = 0
                while got < ln:
                    k = body.readinto(dest[got : min(ln, got + READ_CHUNK)])
                    if not k:
                        break
                    got += k
                if got == ln:
                    return
                why: BaseException = S3TruncatedError(uri, f"got {got} of {ln} bytes at {start}")
            except self._errors as exc:
                why = self._fail(exc, name)
            finally:
                body.close()
            if attempt + 1 >= self.options.max_attempts:
                raise S3TruncatedError(
                    uri, f"{reason(why)} (after {attempt + 1} attempts)", getattr(why, "code", "")
                ) from why
            log.debug("%s: %s; reading again", uri, why)
            self._backoff(attempt)

    # ---- list and delete ------------------------------------------------------------------

    def list_objects(self, prefix: str = "", after: str = "") -> Iterator[ObjectInfo]:
        """Every object whose name starts with ``prefix`` (and, with ``after``, sorts after
        that name), in key order, page by page."""
        for page in self._pages(prefix, None, after):
            for o in page.get("Contents", []):
                version = (str(o.get("ETag", "")), str(o.get("LastModified", "")))
                yield ObjectInfo(self.location.name(o["Key"]), int(o["Size"]), version)

    def list_dirs(self, prefix: str = "") -> list[str]:
        """The names of the "directories" right under ``prefix`` (ending in ``/``): e.g. the
        step prefixes of a tier, without listing every shard."""
        out: list[str] = []
        for page in self._pages(prefix, "/"):
            out += [
                self.location.name(p["Prefix"]).rstrip("/") for p in page.get("CommonPrefixes", [])
            ]
        return out

    def _pages(
        self, prefix: str, delimiter: str | None, after: str = ""
    ) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "Prefix": self.location.list_key(prefix),
            "MaxKeys": self.options.page_size,
        }
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if after:
            kwargs["StartAfter"] = self.location.list_key(after)
        token = None
        for _ in range(1 << 24):  # a bound, far beyond any real listing
            page = self._call(
                prefix,
                "list_objects_v2",
                **kwargs,
                **({"ContinuationToken": token} if token else {}),
            )
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, names: Iterable[str]) -> None:
        """Delete objects (absent ones are not an error), 1000 per request, in the given order
        of batches: to retire a step, pass its manifest in a first call."""
        batch: list[str] = []
        for name in names:
            batch.append(name)
            if len(batch) == 1000:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, names: list[str]) -> None:
        objects = [{"Key": self.location.key(n)} for n in names]
        r = self._call(names[0], "delete_objects", Delete={"Objects": objects, "Quiet": True})
        errors = r.get("Errors") or []
        if errors:
            first = errors[0]
            name = self.location.name(first.get("Key", self.location.key(names[0])))
            raise S3Error(
                self.location.uri(name),
                f"delete failed ({first.get('Code', '?')}: {first.get('Message', '')})"
                + (f"; and {len(errors) - 1} more objects" if len(errors) > 1 else ""),
                str(first.get("Code", "")),
            )

    # ---- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
