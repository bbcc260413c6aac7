"""Errors of the S3-compatible persistent tier: one line naming the object and what to do.

Every failure a user meets is mapped here from what the client library raised (a botocore
exception, read duck-typed so this module imports without boto3) to one of a few types.
Each message starts with ``s3://bucket/key`` (or ``s3://bucket/prefix/`` for a listing)
and ends with the remedy, e.g.::

    s3://ckpt/run1/step-0000000100/rank-00000.bin: access denied (SignatureDoesNotMatch):
    the secret key does not match access key AKIA…; check AWS_SECRET_ACCESS_KEY or the profile

A missing or truncated object is also a :class:`CorruptShardError`, so a restore treats it
like a bad file of the filesystem tier: it logs it and falls back.
"""

from __future__ import annotations

from typing import Any

from hyperpod_agent.checkpoint.errors import (
    CheckpointConfigError,
    CheckpointStorageError,
    CorruptShardError,
)

# S3 error codes, grouped by what the user has to do about them.
_AUTH_CODES = {
    "InvalidAccessKeyId": "access key {access} is unknown to {endpoint}; check "
    "AWS_ACCESS_KEY_ID or the profile's aws_access_key_id",
    "SignatureDoesNotMatch": "the secret key does not match access key {access}; check "
    "AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key",
    "AccessDenied": "access key {access} may not do this; check the bucket policy or the "
    "credentials",
    "ExpiredToken": "the session token has expired; refresh the credentials",
    "InvalidToken": "the session token is invalid; check AWS_SESSION_TOKEN",
    "TokenRefreshRequired": "the session token has expired; refresh the credentials",
}
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


class S3Error(CheckpointStorageError):
    """An S3 request failed; ``uri`` names the object (or prefix), ``code`` the S3 error."""

    def __init__(self, uri: str, what: str, code: str = ""):
        super().__init__(f"{uri}: {what}")
        self.uri, self.code = uri, code


class S3ConfigError(S3Error, CheckpointConfigError):
    """The S3 location or the client setup is invalid (bad URL, missing library)."""


class S3AuthError(S3Error):
    """The credentials are missing, unknown, wrong or not allowed to do this."""


class S3BucketError(S3Error):
    """The bucket does not exist at this endpoint."""


class S3UnreachableError(S3Error):
    """The endpoint refused the connection or did not answer in time."""


class S3ThrottledError(S3Error):
    """The store kept answering 503 SlowDown (or another throttle) after every retry."""


class S3ObjectMissingError(S3Error, CorruptShardError):
    """The object does not exist."""


class S3TruncatedError(S3Error, CorruptShardError):
    """The object, or the answer for it, is shorter or longer than expected."""


def _code_and_status(exc: Any) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _attempts(exc: Any) -> str:
    response = getattr(exc, "response", None) or {}
    n = response.get("ResponseMetadata", {}).get("RetryAttempts")
    return f" after {int(n) + 1} attempts" if n else ""


def classify(exc: BaseException, uri: str, endpoint: str, access_key: str) -> S3Error:
    """Map a client library exception for the object ``uri`` to one clear S3Error.

    ``endpoint`` and ``access_key`` only go into the message (never the secret).
    """
    if isinstance(exc, S3Error):
        return exc
    name = type(exc).__name__
    code, status = _code_and_status(exc)
    where = endpoint or "the default AWS endpoint"
    access = access_key or "(none)"
    if code in _AUTH_CODES or status == 403:
        hint = _AUTH_CODES.get(code, _AUTH_CODES["AccessDenied"])
        return S3AuthError(
            uri,
            f"access denied ({code or status}): " + hint.format(access=access, endpoint=where),
            code,
        )
    if code == "NoSuchBucket":
        bucket = uri.removeprefix("s3://").split("/", 1)[0]
        return S3BucketError(uri, f"no bucket {bucket!r} at {where}; create it first", code)
    if code in _MISSING_CODES or status == 404:
        return S3ObjectMissingError(uri, "no such object", code or "NoSuchKey")
    if code == "InvalidRange" or status == 416:
        return S3TruncatedError(uri, "object is shorter than the range asked for", code)
    if code in _THROTTLE_CODES or status in (429, 503):
        return S3ThrottledError(
            uri,
            f"throttled by {where} ({code or status}){_attempts(exc)}; the store is "
            "overloaded: retry later, or lower the request rate (concurrency)",
            code or str(status),
        )
    if name == "NoCredentialsError":
        return S3AuthError(
            uri,
            "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE with ~/.aws/credentials",
            "NoCredentials",
        )
    if name in ("ProfileNotFound", "InvalidConfigError", "ConfigParseError"):
        return S3ConfigError(uri, f"AWS configuration: {exc}", name)
    if name in ("EndpointConnectionError", "ConnectionClosedError", "ProxyConnectionError"):
        return S3UnreachableError(uri, f"cannot connect to {where}: {_reason(exc)}", name)
    if name in ("ConnectTimeoutError", "ReadTimeoutError"):
        return S3UnreachableError(uri, f"no answer from {where} in time ({_reason(exc)})", name)
    if name in ("ResponseStreamingError", "IncompleteReadError", "ProtocolError"):
        return S3TruncatedError(uri, f"answer cut short: {_reason(exc)}", name)
    if code or status:
        return S3Error(uri, f"{code or status}: {_reason(exc)}", code)
    return S3Error(uri, f"{name}: {_reason(exc)}", name)


def _reason(exc: BaseException) -> str:
    """The innermost useful text of an exception chain, on one line."""
    text = str(exc)
    inner: BaseException | None = exc
    for _ in range(5):
        inner = inner.__cause__ or inner.__context__ if inner is not None else None
        if inner is None:
            break
        if "Connection refused" in str(inner):
            return "connection refused"
    if "Connection refused" in text:
        return "connection refused"
    return " ".join(text.split())
