"""A small ctypes binding to libmunge (``libmunge.so.2``).

Only what request authentication needs: encode a credential around a payload and
decode one back into (uid, gid, payload, origin address, encode time). The library
is loaded on first use, so importing this module never fails on a machine without
MUNGE; :class:`MungeError` says what is missing instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import ipaddress
import threading
from dataclasses import dataclass
from pathlib import Path

from hyperpod_agent.errors import HyperpodError

LIBRARY = "libmunge.so.2"


class MungeOpt(enum.IntEnum):
    """``munge_opt_t`` values from munge.h (stable ABI since 0.5)."""

    CIPHER_TYPE = 0
    MAC_TYPE = 1
    ZIP_TYPE = 2
    REALM = 3
    TTL = 4
    ADDR4 = 5
    ENCODE_TIME = 6
    DECODE_TIME = 7
    SOCKET = 8
    UID_RESTRICTION = 9
    GID_RESTRICTION = 10


class MungeErr(enum.IntEnum):
    """``munge_err_t`` values from munge.h."""

    SUCCESS = 0
    SNAFU = 1
    BAD_ARG = 2
    BAD_LENGTH = 3
    OVERFLOW = 4
    NO_MEMORY = 5
    SOCKET = 6
    TIMEOUT = 7
    BAD_CRED = 8
    BAD_VERSION = 9
    BAD_CIPHER = 10
    BAD_MAC = 11
    BAD_ZIP = 12
    BAD_REALM = 13
    CRED_INVALID = 14
    CRED_EXPIRED = 15
    CRED_REWOUND = 16
    CRED_REPLAYED = 17
    CRED_UNAUTHORIZED = 18


# Errors that are the caller's fault (a bad, stale or reused credential), as opposed to
# our munged being unreachable or broken.
CREDENTIAL_ERRORS = frozenset(
    {
        MungeErr.BAD_ARG,
        MungeErr.BAD_LENGTH,
        MungeErr.BAD_CRED,
        MungeErr.BAD_VERSION,
        MungeErr.BAD_CIPHER,
        MungeErr.BAD_MAC,
        MungeErr.BAD_ZIP,
        MungeErr.BAD_REALM,
        MungeErr.CRED_INVALID,
        MungeErr.CRED_EXPIRED,
        MungeErr.CRED_REWOUND,
        MungeErr.CRED_REPLAYED,
        MungeErr.CRED_UNAUTHORIZED,
    }
)


class MungeError(HyperpodError):
    """A libmunge call failed; ``code`` is the ``munge_err_t`` (None: library missing)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    @property
    def is_credential_error(self) -> bool:
        """True when the credential itself was refused (not a local munged failure)."""
        return self.code is not None and self.code in CREDENTIAL_ERRORS


@dataclass(frozen=True)
class Decoded:
    """What ``munge_decode`` tells about a valid credential."""

    uid: int
    gid: int
    payload: bytes
    addr: str  # origin IPv4 address as dotted quad
    encode_time: int


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_libc: ctypes.CDLL | None = None


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    global _lib, _libc
    with _lock:
        if _lib is None or _libc is None:
            try:
                lib = ctypes.CDLL(LIBRARY)
            except OSError as exc:
                raise MungeError(f"cannot load {LIBRARY} (is munge installed?): {exc}") from exc
            lib.munge_ctx_create.restype = ctypes.c_void_p
            lib.munge_ctx_create.argtypes = []
            lib.munge_ctx_destroy.restype = None
            lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_strerror.restype = ctypes.c_char_p
            lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
            lib.munge_strerror.restype = ctypes.c_char_p
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_encode.argtypes = [
                ctypes.POINTER(ctypes.c_char_p),
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int,
            ]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.POINTER(ctypes.c_uint32),
            ]
            # munge_ctx_set/get are variadic; every option we use passes one pointer,
            # which the x86-64 and aarch64 calling conventions pass like a fixed argument.
            lib.munge_ctx_set.restype = ctypes.c_int
            lib.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
            lib.munge_ctx_get.restype = ctypes.c_int
            lib.munge_ctx_get.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.free.restype = None
            libc.free.argtypes = [ctypes.c_void_p]
            _lib, _libc = lib, libc
        return _lib, _libc


def available() -> bool:
    """True when libmunge can be loaded."""
    try:
        _load()
    except MungeError:
        return False
    return True


def _strerror(lib: ctypes.CDLL, code: int) -> str:
    text = lib.munge_strerror(code)
    return text.decode(errors="replace") if text else f"munge error {code}"


class _Context:
    """A ``munge_ctx_t`` owned by one call; always destroyed."""

    def __init__(self, lib: ctypes.CDLL, socket: Path | None):
        self.lib = lib
        self.ctx = lib.munge_ctx_create()
        if not self.ctx:
            raise MungeError("munge_ctx_create failed (out of memory)", MungeErr.NO_MEMORY)
        if socket is not None:
            # munge copies the string, so a temporary buffer is fine.
            path = ctypes.create_string_buffer(str(socket).encode())
            rc = lib.munge_ctx_set(self.ctx, MungeOpt.SOCKET, ctypes.cast(path, ctypes.c_void_p))
            if rc != MungeErr.SUCCESS:
                self.close()
                raise MungeError(f"cannot set munge socket {socket}: {_strerror(lib, rc)}", rc)

    def error(self, rc: int) -> str:
        text = self.lib.munge_ctx_strerror(self.ctx)
        return text.decode(errors="replace") if text else _strerror(self.lib, rc)

    def close(self) -> None:
        if self.ctx:
            self.lib.munge_ctx_destroy(self.ctx)
            self.ctx = None


def encode(payload: bytes, socket: Path | None = None) -> str:
    """Create a credential carrying ``payload`` from the local munged at ``socket``."""
    lib, libc = _load()
    ctx = _Context(lib, socket)
    try:
        cred = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(payload, len(payload))
        rc = lib.munge_encode(ctypes.byref(cred), ctx.ctx, buf, len(payload))
        if rc != MungeErr.SUCCESS:
            raise MungeError(f"munge_encode failed: {ctx.error(rc)}", rc)
        try:
            value = cred.value or b""
        finally:
            libc.free(ctypes.cast(cred, ctypes.c_void_p))
        return value.decode("ascii")
    finally:
        ctx.close()


def decode(credential: str, socket: Path | None = None) -> Decoded:
    """Validate ``credential`` with the local munged; raise MungeError when it is refused."""
    lib, libc = _load()
    try:
        raw = credential.encode("ascii")
    except UnicodeEncodeError as exc:
        raise MungeError("credential is not ASCII", MungeErr.BAD_CRED) from exc
    ctx = _Context(lib, socket)
    try:
        out = ctypes.c_void_p()
        length = ctypes.c_int(0)
        uid = ctypes.c_uint32(0)
        gid = ctypes.c_uint32(0)
        rc = lib.munge_decode(
            raw,
            ctx.ctx,
            ctypes.byref(out),
            ctypes.byref(length),
            ctypes.byref(uid),
            ctypes.byref(gid),
        )
        try:
            # On some errors (expired, replayed) munge still returns the payload; we
            # never trust it then, but must free it.
            payload = ctypes.string_at(out, length.value) if out.value else b""
        finally:
            if out.value:
                libc.free(out)
        if rc != MungeErr.SUCCESS:
            raise MungeError(ctx.error(rc), rc)
        addr = (ctypes.c_uint8 * 4)()
        rc = lib.munge_ctx_get(ctx.ctx, MungeOpt.ADDR4, ctypes.cast(addr, ctypes.c_void_p))
        origin = str(ipaddress.IPv4Address(bytes(addr))) if rc == MungeErr.SUCCESS else ""
        when = ctypes.c_long(0)
        rc = lib.munge_ctx_get(ctx.ctx, MungeOpt.ENCODE_TIME, ctypes.byref(when))
        encoded_at = when.value if rc == MungeErr.SUCCESS else 0
        return Decoded(uid.value, gid.value, payload, origin, encoded_at)
    finally:
        ctx.close()
