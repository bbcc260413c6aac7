"""Where the S3 tier is and how its client finds endpoint, region and credentials: the
standard AWS variables and files, against the real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.checkpoint.errors import CheckpointConfigError
from hyperpod_agent.checkpoint.s3config import MiB, S3Location, S3Options, is_s3_url
from hyperpod_agent.checkpoint.s3errors import S3ConfigError
from hyperpod_agent.checkpoint.s3store import S3Store

from .conftest import use_aws_env


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://ckpt", "ckpt", ""),
        ("s3://ckpt/", "ckpt", ""),
        ("s3://my.bucket-1/jobs/1234/", "my.bucket-1", "jobs/1234"),
    ],
)
def test_location_parse(url: str, bucket: str, prefix: str) -> None:
    loc = S3Location.parse(url)
    assert (loc.bucket, loc.prefix) == (bucket, prefix)
    assert loc.uri("step-0000000001/step.json") == f"s3://{bucket}/" + (
        f"{prefix}/step-0000000001/step.json" if prefix else "step-0000000001/step.json"
    )


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("/shared/ckpt", "expected s3://bucket/prefix"),
        ("s3://Big_Bucket/x", "invalid bucket name 'Big_Bucket' (3-63 of a-z, 0-9, '.', '-')"),
        ("s3://ab/x", "invalid bucket name 'ab' (3-63 of a-z, 0-9, '.', '-')"),
        ("s3://ckpt/a//b", "the prefix has an empty, '.' or '..' segment"),
        ("s3://ckpt/a/../b", "the prefix has an empty, '.' or '..' segment"),
        ("s3://ckpt/x?versionId=1", "expected s3://bucket/prefix"),
    ],
)
def test_bad_locations_name_the_url(url: str, why: str) -> None:
    with pytest.raises(S3ConfigError) as e:
        S3Location.parse(url)
    assert str(e.value) == f"{url}: {why}"
    assert isinstance(e.value, CheckpointConfigError)


def test_is_s3_url() -> None:
    assert is_s3_url("s3://b/p")
    assert not is_s3_url("/shared/ckpt") and not is_s3_url(Path("s3:/x"))


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"part_size": MiB}, "part_size must be 5 MiB-5 GiB"),
        ({"concurrency": 0}, "concurrency must be 1-64"),
        ({"max_attempts": 0}, "max_attempts must be 1-20"),
        ({"read_timeout": 0}, "timeouts must be > 0"),
        ({"page_size": 1001}, "page_size must be 1-1000"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(S3ConfigError, match=why):
        S3Options(**kwargs)


def test_part_size_grows_to_stay_within_10000_parts() -> None:
    opts = S3Options(part_size=8 * MiB)
    assert opts.part_size_for(80_000 * MiB) == 8 * MiB
    big = 200_000 * MiB
    assert opts.part_size_for(big) == 20 * MiB and big / (20 * MiB) <= 10_000


def _roundtrip(url: str = "s3://ckpt/cfg") -> None:
    with S3Store(url, S3Options(max_attempts=1)) as store:
        store.put("x", b"ok")
        assert store.get("x") == b"ok"


def test_profile_from_config_and_credentials_files(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config, creds = tmp_path / "config", tmp_path / "credentials"
    config.write_text(f"[profile site]\nregion = eu-west-3\nendpoint_url = {s3_server.url}\n")
    creds.write_text(
        "[site]\n"
        f"aws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n"
    )
    use_aws_env(monkeypatch, tmp_path, {})
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "site")
    _roundtrip()
    with S3Store("s3://ckpt/cfg") as store:
        assert store._client.meta.region_name == "eu-west-3"
        assert store.endpoint == s3_server.url


def test_unknown_profile(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_aws_env(monkeypatch, tmp_path, {**s3_server.env(), "AWS_PROFILE": "nope"})
    with pytest.raises(S3ConfigError) as e:
        S3Store("s3://ckpt/run1")
    assert str(e.value) == (
        "s3://ckpt/run1/: AWS configuration: The config profile (nope) could not be found"
    )


def test_service_endpoint_wins_over_the_general_one(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {**s3_server.env("http://127.0.0.1:9"), "AWS_ENDPOINT_URL_S3": s3_server.url}
    use_aws_env(monkeypatch, tmp_path, env)
    _roundtrip()


def test_region_variables(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = s3_server.env()
    del env["AWS_REGION"]
    use_aws_env(monkeypatch, tmp_path, {**env, "AWS_DEFAULT_REGION": "ap-south-1"})
    with S3Store("s3://ckpt/cfg") as store:
        assert store._client.meta.region_name == "ap-south-1"
    # AWS_REGION (read by the other SDKs, not by botocore) comes first.
    monkeypatch.setenv("AWS_REGION", "eu-north-1")
    with S3Store("s3://ckpt/cfg") as store:
        assert store._client.meta.region_name == "eu-north-1"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with S3Store("s3://ckpt/cfg") as store:
        assert store._client.meta.region_name == "us-east-1"
    _roundtrip()


def test_a_site_store_is_addressed_path_style(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_aws_env(monkeypatch, tmp_path, s3_server.env(f"http://localhost:{s3_server.port}"))
    with S3Store("s3://ckpt/cfg") as store:
        assert store._client.meta.config.s3["addressing_style"] == "path"
    _roundtrip()  # virtual-hosted would ask ckpt.localhost


def test_package_imports_without_boto3_and_the_store_says_what_is_missing() -> None:
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
        "import hyperpod_agent.checkpoint\n"
        "from hyperpod_agent.checkpoint.s3store import S3Store\n"
        "try:\n    S3Store('s3://ckpt/run1')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "S3ConfigError s3://ckpt/run1/: the S3 tier needs boto3, which is not installed: "
        "pip install boto3"
    )
