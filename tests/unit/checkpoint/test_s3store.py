"""The S3 store against a real S3 server (rclone serve s3 on loopback): round trips, ranged
and parallel reads, listing with pagination, batch delete, bounded memory."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint.errors import CorruptShardError
from hyperpod_agent.checkpoint.s3config import MiB, S3Options
from hyperpod_agent.checkpoint.s3errors import S3ObjectMissingError, S3TruncatedError
from hyperpod_agent.checkpoint.s3store import S3Store

# Small parts so that a few MiB exercise multipart uploads and many ranged GETs.
SMALL = S3Options(part_size=5 * MiB, multipart_threshold=5 * MiB, concurrency=4)


def _data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("size", [0, 1, 5 * MiB, 5 * MiB + 1, 17 * MiB + 3])
def test_put_then_read_back_bit_exact(s3_url: str, s3_server: Any, size: int) -> None:
    data = _data(size, size)
    with S3Store(s3_url, SMALL) as store:
        assert store.put("obj.bin", data) == size
        assert store.size("obj.bin") == size
        out = np.full(size, 7, dtype=np.uint8)
        store.read_into("obj.bin", out, size=size)
        assert out.tobytes() == data.tobytes()
        assert store.get("obj.bin") == data.tobytes()
    # The server holds exactly these bytes (a multipart upload reassembled in order).
    on_disk = s3_server.object_path("ckpt", f"{s3_url.split('/', 3)[3]}/obj.bin")
    assert zlib.crc32(on_disk.read_bytes()) == zlib.crc32(data)


def test_put_of_several_buffers_is_their_concatenation(s3_url: str) -> None:
    # Leaves of one rank: parts of the upload span buffer boundaries (assembled) or lie in
    # one buffer (sent as views).
    segs = [_data(3 * MiB, 1), np.arange(7 * MiB // 8, dtype=np.float64), _data(6 * MiB + 5, 3)]
    whole = b"".join(s.tobytes() for s in segs)
    with S3Store(s3_url, SMALL) as store:
        assert store.put("leaves.bin", segs) == len(whole)
        assert store.get("leaves.bin") == whole


def test_typed_and_non_contiguous_buffers(s3_url: str) -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    with S3Store(s3_url, SMALL) as store:
        store.put("a.bin", a)
        out = np.empty_like(a)
        store.read_into("a.bin", out, size=a.nbytes)
        assert (out == a).all()
        with pytest.raises(ValueError, match="contiguous"):
            store.put("b.bin", a[:, ::2])
        with pytest.raises(ValueError, match="writable"):
            store.read_into("a.bin", a.tobytes())


def test_ranged_read_at_offsets(s3_url: str) -> None:
    data = _data(12 * MiB + 11, 5)
    with S3Store(s3_url, SMALL) as store:
        store.put("r.bin", data)
        for offset, n in [
            (0, 1),
            (1, 10),
            (5 * MiB - 3, 7),
            (3 * MiB, 9 * MiB + 11),
            (12 * MiB + 10, 1),
        ]:
            out = np.empty(n, dtype=np.uint8)
            store.read_into("r.bin", out, offset=offset)
            assert out.tobytes() == data[offset : offset + n].tobytes(), (offset, n)


def test_parallel_read_fills_every_part(s3_url: str) -> None:
    # 9 ranges of 5 MiB on 4 threads; each range lands at its own place in the buffer.
    data = _data(45 * MiB - 1, 6)
    with S3Store(s3_url, SMALL) as store:
        store.put("p.bin", data)
        out = np.zeros_like(data)
        store.read_into("p.bin", out, size=data.size)
        assert zlib.crc32(out) == zlib.crc32(data)


def test_read_past_the_end_or_of_a_different_size_is_truncation(s3_url: str) -> None:
    with S3Store(s3_url, SMALL) as store:
        store.put("t.bin", _data(1000))
        with pytest.raises(
            S3TruncatedError, match=r"t\.bin: object is 1000 bytes, shorter than 1001"
        ):
            store.read_into("t.bin", np.empty(1001, dtype=np.uint8))
        with pytest.raises(S3TruncatedError, match=r"t\.bin: object is 1000 bytes, expected 2000"):
            store.read_into("t.bin", np.empty(1000, dtype=np.uint8), size=2000)
        with pytest.raises(S3TruncatedError, match=r"t\.bin: "):
            store.read_into("t.bin", np.empty(10, dtype=np.uint8), offset=1000)
        with pytest.raises(S3TruncatedError, match=r"t\.bin: object is 1000 bytes, expected 5"):
            store.read_into("t.bin", np.empty(0, dtype=np.uint8), size=5)


def test_missing_object(s3_url: str) -> None:
    with S3Store(s3_url, SMALL) as store:
        assert store.size("none.bin") is None
        for read in (
            lambda: store.get("none.bin"),
            lambda: store.read_into("none.bin", np.empty(10, dtype=np.uint8)),
            lambda: store.read_into("none.bin", np.empty(0, dtype=np.uint8)),
        ):
            with pytest.raises(
                S3ObjectMissingError, match=rf"^{s3_url}/none\.bin: no such object$"
            ):
                read()
        # A restore treats it like a missing file of the filesystem tier.
        assert issubclass(S3ObjectMissingError, CorruptShardError)


def test_overwrite_replaces_whole_object(s3_url: str) -> None:
    with S3Store(s3_url, SMALL) as store:
        store.put("o.bin", _data(12 * MiB, 1))
        store.put("o.bin", b"short")
        assert store.get("o.bin") == b"short"


def test_listing_is_paginated_and_complete(s3_url: str) -> None:
    names = [f"step-{s:010d}/rank-{r:05d}.json" for s in (1, 2, 10) for r in range(4)]
    with S3Store(s3_url, S3Options(page_size=3)) as store:
        for n in names:
            store.put(n, n.encode())
        store.put("resume.json", b"{}")
        listed = list(store.list_objects())
        assert [o.name for o in listed] == sorted([*names, "resume.json"])  # 13 keys, 5 pages
        assert all(o.size == len(o.name) for o in listed if o.name != "resume.json")
        assert [o.name for o in store.list_objects("step-0000000002/")] == names[4:8]
        assert store.list_dirs() == [f"step-{s:010d}" for s in (1, 2, 10)]


def test_listing_an_empty_prefix(s3_url: str) -> None:
    with S3Store(s3_url) as store:
        assert list(store.list_objects()) == []
        assert store.list_dirs() == []


def test_prefixes_do_not_see_each_other(s3_url: str) -> None:
    with S3Store(s3_url + "/a") as a, S3Store(s3_url + "/ab") as ab:
        a.put("x", b"1")
        ab.put("x", b"2")
        assert [o.name for o in a.list_objects()] == ["x"]
        assert a.get("x") == b"1" and ab.get("x") == b"2"


def test_batch_delete_more_than_one_request(s3_url: str) -> None:
    names = [f"d/{i:04d}" for i in range(1203)]  # two DeleteObjects requests
    with S3Store(s3_url, S3Options(concurrency=16)) as store:
        for n in names:
            store.put(n, b"")
        store.put("keep", b"k")
        store.delete([*names, "never-existed"])  # absent objects are not an error
        assert [o.name for o in store.list_objects()] == ["keep"]


def test_invalid_object_names_are_refused(s3_url: str) -> None:
    with S3Store(s3_url) as store:
        for bad in ("", "/x", "a//b", "a/../b", "./a"):
            with pytest.raises(ValueError, match="invalid object name"):
                store.put(bad, b"x")


def test_upload_of_a_large_buffer_does_not_copy_it(s3_url: str) -> None:
    """Parts are views of the caller's buffer: peak RSS grows by far less than the object
    (bench/s3_clients.py measures it; this is a generous bound)."""
    data = np.ones(192 * MiB, dtype=np.uint8)  # touched: already resident
    with S3Store(s3_url, S3Options(part_size=16 * MiB, concurrency=4)) as store:
        store.put("warm", b"w")  # client, connection pool and threads exist
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _rss("VmRSS")
        store.put("big.bin", data)
        grown = _rss("VmHWM") - before
        assert store.size("big.bin") == data.size
    assert grown < 64 * MiB, f"RSS grew by {grown / MiB:.0f} MiB for a 192 MiB upload"


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)
