"""Where the S3 tier is and how its client is set up: ``s3://bucket/prefix`` and options.

The endpoint, region and credentials are never settings of ours: they come from the standard
AWS environment variables and files, resolved by botocore exactly as the AWS CLI does
(``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with ``~/.aws/config`` and
``~/.aws/credentials``, ``AWS_CONFIG_FILE``, ``AWS_SHARED_CREDENTIALS_FILE``, SSO, roles,
``credential_process``, instance and container roles). Two gaps of botocore are filled here:
``AWS_REGION`` (read by the other AWS SDKs, not by botocore) is honoured before
``AWS_DEFAULT_REGION``, and a store that is not AWS (Ceph RGW, MinIO, VAST, Weka, ...) is
addressed path-style (``http://host/bucket/key``) unless the profile says otherwise, as
virtual-hosted names (``bucket.host``) rarely resolve on a site's network.

boto3 is imported only when a store is opened, so ``import hyperpod_agent.checkpoint`` works
without it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hyperpod_agent.checkpoint.s3errors import S3ConfigError

MiB = 1 << 20
MIN_PART = 5 * MiB  # S3's smallest part (all but the last)
MAX_PART = 5 << 30
MAX_PARTS = 10_000
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn")


def is_s3_url(text: str | os.PathLike[str]) -> bool:
    """True if ``text`` names an S3 location (``s3://...``) rather than a directory."""
    return isinstance(text, str) and text.startswith("s3://")


def check_name(name: str) -> str:
    """An object name under a store's prefix; refuse what S3-on-files servers refuse too."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object name {name!r}")
    return name


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (without slashes at either end; may be empty)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """Parse ``s3://bucket[/prefix]``; raise S3ConfigError naming the URL."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or parts.query or parts.fragment:
            raise S3ConfigError(url, "expected s3://bucket/prefix")
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise S3ConfigError(url, f"invalid bucket name {bucket!r} (3-63 of a-z, 0-9, '.', '-')")
        if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
            raise S3ConfigError(url, "the prefix has an empty, '.' or '..' segment")
        return cls(bucket, prefix)

    def key(self, name: str) -> str:
        """The full key of the object ``name``."""
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def list_key(self, prefix: str) -> str:
        """The full key prefix for listing the names that start with ``prefix``."""
        if prefix.startswith("/"):
            raise ValueError(f"invalid listing prefix {prefix!r}")
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def name(self, key: str) -> str:
        """Inverse of :meth:`key`."""
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def uri(self, name: str = "") -> str:
        """``s3://bucket/key`` for messages."""
        return f"s3://{self.bucket}/{self.list_key(name)}"


@dataclass(frozen=True)
class S3Options:
    """Transfer and robustness settings of a store (endpoint and credentials are AWS's)."""

    part_size: int = 16 * MiB  # multipart part and ranged GET size
    multipart_threshold: int = 64 * MiB  # larger objects are uploaded in parallel parts
    concurrency: int = 8  # requests in flight per transfer
    connect_timeout: float = 10.0  # seconds, each connection attempt
    read_timeout: float = 60.0  # seconds without a byte on an open connection
    max_attempts: int = 5  # per request, with exponential back-off and jitter (SlowDown)
    page_size: int = 1000  # keys per listing request

    def __post_init__(self) -> None:
        checks = [
            (
                MIN_PART <= self.part_size <= MAX_PART,
                f"part_size must be 5 MiB-5 GiB, got {self.part_size}",
            ),
            (self.multipart_threshold >= 0, "multipart_threshold must be >= 0"),
            (1 <= self.concurrency <= 64, f"concurrency must be 1-64, got {self.concurrency}"),
            (self.connect_timeout > 0 and self.read_timeout > 0, "timeouts must be > 0"),
            (1 <= self.max_attempts <= 20, f"max_attempts must be 1-20, got {self.max_attempts}"),
            (1 <= self.page_size <= 1000, f"page_size must be 1-1000, got {self.page_size}"),
        ]
        for ok, why in checks:
            if not ok:
                raise S3ConfigError("s3 options", why)

    def part_size_for(self, total: int) -> int:
        """The part size for an object of ``total`` bytes: ours, grown to stay in 10,000 parts."""
        need = -(-total // MAX_PARTS)
        return max(self.part_size, -(-need // MiB) * MiB)


def make_client(loc: S3Location, opts: S3Options) -> tuple[Any, Any]:
    """A botocore S3 client configured from the AWS environment and files, and ``opts``;
    and the boto3 session it came from (which resolves the credentials)."""
    uri = loc.uri()
    try:
        import boto3.session
        import botocore.exceptions
        import botocore.session
        from botocore.config import Config
    except ImportError:
        raise S3ConfigError(
            uri, "the S3 tier needs boto3, which is not installed: pip install boto3"
        ) from None
    try:
        core = botocore.session.get_session()
        session = boto3.session.Session(botocore_session=core)
        region = os.environ.get("AWS_REGION") or session.region_name or "us-east-1"
        configured = (core.get_scoped_config().get("s3") or {}).get("addressing_style")
    except botocore.exceptions.BotoCoreError as exc:
        raise S3ConfigError(uri, f"AWS configuration: {exc}") from exc

    def build(style: str | None) -> Any:
        cfg = Config(
            connect_timeout=opts.connect_timeout,
            read_timeout=opts.read_timeout,
            retries={"mode": "standard", "total_max_attempts": opts.max_attempts},
            max_pool_connections=opts.concurrency + 2,
            # Each leaf carries its CRC-32, checked on restore; and some stores (rclone,
            # Ceph RGW before 2025) send the whole object's checksum with a ranged answer,
            # which botocore would reject.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": style} if style else None,
            user_agent_extra="hyperpod-agent",
        )
        return session.client("s3", region_name=region, config=cfg)

    client = build(configured)
    host = urlsplit(client.meta.endpoint_url).hostname or ""
    if not configured and not host.endswith(_AWS_HOSTS):
        client.close()
        client = build("path")
    return client, session
