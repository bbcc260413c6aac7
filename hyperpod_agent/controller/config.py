"""Controller configuration: ``/etc/hyperpod/controller.toml``.

Every section has working defaults; a file only lists what it changes. Errors name
the file, the key and what was expected.
"""

from __future__ import annotations

import logging
import socket
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.config_files import without_newer_keys
from hyperpod_agent.controller.config_deep import DeepCheckConfig, check_suite
from hyperpod_agent.controller.store.url import (
    PostgresLocation,
    StoreLocation,
    parse_store_url,
    store_location,
)
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.health import Action

DEFAULT_PATH = Path("/etc/hyperpod/controller.toml")
DEFAULT_PORT = 8787

_FROZEN = ConfigDict(extra="forbid", frozen=True)


class FaultRule(BaseModel):
    """Override of what a fault code asks for (DESIGN §9 table lives in the agent)."""

    model_config = _FROZEN

    action: Action
    urgent: bool = False


class PolicyConfig(BaseModel):
    """``[policy]``: when to act and how far automation may go."""

    model_config = _FROZEN

    mode: Literal["act", "observe"] = Field(
        default="act",
        description='"observe": every automatic action is decided, logged and counted as '
        '"would have" (event would_have, hyperpod_would_have_total) and nothing in Slurm '
        "changes; the rollout starts there (docs/operations.md)",
    )
    dry_run: bool = Field(
        default=False,
        description='deprecated, removed in the release after next: mode = "observe" '
        "(true still means it)",
    )
    fault_overrides: dict[str, FaultRule] = Field(
        default_factory=dict, description="fault code (xid79, link_down) -> action/urgency"
    )
    escalation_window_s: float = Field(default=3600.0, gt=0)
    max_unhealthy_fraction: float = Field(default=0.10, gt=0, le=1)
    min_unhealthy_nodes: int = Field(
        default=1, ge=0, description="nodes a partition may always lose, whatever its size"
    )
    lemon_window_s: float = Field(default=7 * 86400.0, gt=0)
    lemon_threshold: int = Field(default=5, ge=2)
    heartbeat_timeout_s: float = Field(default=90.0, gt=0)
    report_max_age_s: float = Field(default=300.0, gt=0)
    clock_skew_s: float = Field(default=60.0, ge=0)
    reset_timeout_s: float = Field(default=600.0, gt=0)
    replace_timeout_s: float = Field(default=1800.0, gt=0)
    cooldown_s: float = Field(default=60.0, ge=0)
    max_attempts: int = Field(default=5, ge=1, description="executor retries per action")
    retry_backoff_s: float = Field(default=5.0, ge=0)
    intent_max_age_s: float = Field(
        default=900.0, gt=0, description="an intent not applied by then is abandoned"
    )
    shared_cause_window_s: float = Field(
        default=30.0,
        ge=0,
        description="faults of one code this close together are one cause; non-urgent "
        "take-outs wait this long to see whether others share it; 0 switches both off",
    )
    shared_cause_min_nodes: int = Field(
        default=3, ge=2, description="nodes showing one fault code at once make a shared cause"
    )

    @property
    def observe(self) -> bool:
        """Decide and count, change nothing (``mode = "observe"`` or the old dry_run)."""
        return self.mode == "observe" or self.dry_run


class AutoResumeConfig(BaseModel):
    """``[auto_resume]``: requeueing opted-in jobs (DESIGN §4)."""

    model_config = _FROZEN

    enabled: bool = True
    retry_on: Literal["node_fault", "any_failure"] = "node_fault"
    default_attempts: int = Field(default=3, ge=1)
    backoff_base_s: float = Field(default=10.0, ge=0)
    backoff_max_s: float = Field(default=600.0, ge=0)
    max_requeues_per_minute: int = Field(default=20, ge=1)
    fault_window_s: float = Field(default=600.0, gt=0)
    step_retry_wait_s: int = Field(
        default=30,
        ge=1,
        le=300,
        description="step retry: how long the helper allocation may wait for the spare "
        "(salloc --immediate) before the retry falls back to a requeue",
    )
    checkpoint_root: Path | None = Field(
        default=None,
        description="jobs' checkpoint dirs are <root>/<jobid> (the SPANK plugin's "
        "checkpoint_root=); resume.json there gives resumed_from_step",
    )

    @model_validator(mode="after")
    def _backoff(self) -> AutoResumeConfig:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        if self.checkpoint_root is not None and not self.checkpoint_root.is_absolute():
            raise ValueError(
                f"checkpoint_root must be an absolute path, got {self.checkpoint_root}"
            )
        return self


class ProviderConfig(BaseModel):
    """``[provider]``: where replacement nodes come from (DESIGN §5)."""

    model_config = _FROZEN

    kind: Literal["spare_pool", "command", "local"] = "spare_pool"
    command: list[str] = Field(default_factory=list, description="argv; node name appended")
    command_timeout_s: float = Field(
        default=100.0,
        gt=0,
        description="below the unit's WatchdogSec (120): the command starts a replacement; "
        "replace_timeout_s bounds the wait for the node",
    )
    local_dir: Path | None = None

    @model_validator(mode="after")
    def _fields_for_kind(self) -> ProviderConfig:
        if self.kind == "command" and not self.command:
            raise ValueError("kind 'command' needs command = [\"/path/to/exe\", ...]")
        if self.kind == "local" and self.local_dir is None:
            raise ValueError("kind 'local' needs local_dir (the local cluster directory)")
        return self


class ProgressConfig(BaseModel):
    """``[progress]``: hangs and stragglers from the training ranks' progress records
    (DESIGN §12). A job is judged only once it has reported ``min_steps`` step times.
    ``hang_factor`` and ``hang_min_s`` are also the floor of a job's own overrides (its
    records may loosen them, never tighten them)."""

    model_config = _FROZEN

    enabled: bool = True
    hang_factor: float = Field(
        default=3.0, gt=0, le=1000, description="hang: no rank advanced for factor x p95 step"
    )
    hang_min_s: float = Field(default=5.0, gt=0, description="hang: and for at least this long")
    max_pause_s: float = Field(
        default=3600.0,
        gt=0,
        le=7 * 86400,
        description="a paused phase longer than this no longer keeps its job from being judged",
    )
    min_steps: int = Field(default=10, ge=2, le=1024, description="step times before judging")
    suspect_action: Literal["reboot", "drain", "none"] = Field(
        default="reboot",
        description="what happens to a node the hang is clearly attributed to",
    )
    cancel_unmanaged: bool = Field(
        default=False, description="cancel a hung job that is not auto-resume (else: event)"
    )
    straggler_threshold: float = Field(
        default=0.20, gt=0, le=100, description="a node this much slower than the job's median"
    )
    straggler_min_steps: int = Field(default=20, ge=2, le=1024)
    straggler_hold_after_job: bool = Field(
        default=False,
        description="hold a straggler node for inspection once its job ended (never mid-job)",
    )


class HaConfig(BaseModel):
    """``[ha]``: several controllers on one PostgreSQL store, one leading (DESIGN §14,
    docs/controller.md "High availability")."""

    model_config = _FROZEN

    enabled: bool = False
    controller_id: str | None = Field(
        default=None, min_length=1, max_length=128, description="default <hostname>:<listen_port>"
    )
    # A leader that dies is replaced within about lease_ttl_s (takeover p50 4 s here,
    # bench/failover.py); renewing every second costs each controller one row update
    # a second.
    lease_ttl_s: float = Field(default=4.0, gt=0, le=600)
    renew_every_s: float = Field(default=1.0, gt=0, le=300)
    clock_margin_s: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description="how far controllers' clocks may differ: a Slurm change must end "
        "this long before the lease does",
    )

    @model_validator(mode="after")
    def _timing(self) -> HaConfig:
        # A leader stops acting renew_every_s before its lease ends; the TTL must leave
        # it at least one more renew than that.
        if self.lease_ttl_s <= 2 * self.renew_every_s:
            raise ValueError(
                f"ha.lease_ttl_s ({self.lease_ttl_s:g}) must be more than twice "
                f"ha.renew_every_s ({self.renew_every_s:g})"
            )
        # What a Slurm change may take inside the lease (controller/gate.py).
        if self.lease_ttl_s - self.renew_every_s - self.clock_margin_s < 1.0:
            raise ValueError(
                f"ha.lease_ttl_s ({self.lease_ttl_s:g}) must exceed ha.renew_every_s "
                f"({self.renew_every_s:g}) plus ha.clock_margin_s ({self.clock_margin_s:g}) "
                "by at least 1 s, the shortest a Slurm change is given"
            )
        return self


class ControllerConfig(BaseModel):
    """The whole ``controller.toml``."""

    model_config = _FROZEN

    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    state_db: Path = Path("/var/lib/hyperpod/controller.db")
    store: str | None = Field(
        default=None,
        description="postgresql://user@host:port/database, or sqlite:///path; "
        "absent: SQLite at state_db",
    )
    store_password_file: Path | None = Field(
        default=None, description="the PostgreSQL password (never in the URL)"
    )
    slurm_conf: Path | None = None
    slurm_user: str = Field(
        default="slurm",
        min_length=1,
        description="slurm.conf's SlurmUser: reasons Slurm writes carry this user",
    )
    slurm_timeout_s: float = Field(default=10.0, gt=0)
    reconcile_interval_s: float = Field(default=10.0, gt=0, le=3600)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    history_retention_s: float = Field(
        default=30 * 86400.0, gt=0, description="events, closed faults, finished actions"
    )
    auth: AuthConfig = Field(default_factory=AuthConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    auto_resume: AutoResumeConfig = Field(default_factory=AutoResumeConfig)
    provider: ProviderConfig = Field(default_factory=ProviderConfig)
    progress: ProgressConfig = Field(default_factory=ProgressConfig)
    deep_checks: DeepCheckConfig = Field(default_factory=DeepCheckConfig)
    ha: HaConfig = Field(default_factory=HaConfig)

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_store_url(value)  # ValueError names what is wrong
        return value

    def store_location(self) -> StoreLocation:
        """Where the state lives (store/url.py)."""
        return store_location(self.store, self.store_password_file, self.state_db)

    def controller_id(self) -> str:
        """This controller's name in the leader lease and in ``/v1/status``."""
        return self.ha.controller_id or f"{socket.gethostname()}:{self.listen_port}"

    @model_validator(mode="after")
    def _cross(self) -> ControllerConfig:
        try:
            self.store_location()
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.ha.enabled and not isinstance(self.store_location(), PostgresLocation):
            raise ValueError(
                'ha.enabled needs a PostgreSQL store (store = "postgresql://…"): '
                "controllers share their state through it"
            )
        if self.policy.heartbeat_timeout_s < self.reconcile_interval_s:
            raise ValueError("policy.heartbeat_timeout_s must be >= reconcile_interval_s")
        longest = max(self.policy.lemon_window_s, self.policy.escalation_window_s)
        if self.history_retention_s < longest:
            raise ValueError(
                "history_retention_s must cover policy.lemon_window_s and escalation_window_s"
            )
        return self


def _describe(exc: ValidationError, path: Path) -> str:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{path}: {key}: {first['msg']}{more}"


def parse_config(text: str, path: Path, *, newer_keys: bool = False) -> ControllerConfig:
    """Parse TOML text; ``path`` only names the source in errors. ``newer_keys``: keys
    this release does not know are ignored with a warning (config_files.load_model)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        return ControllerConfig.model_validate(data)
    except ValidationError as exc:
        kept = without_newer_keys(data, exc, str(path)) if newer_keys else None
        if kept is None:
            raise ConfigError(_describe(exc, path)) from exc
    try:
        return ControllerConfig.model_validate(kept)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from exc


def load_config(path: Path | None = None) -> ControllerConfig:
    """Load the config; the default path may be absent (defaults), an explicit one may not."""
    explicit = path is not None
    target = path if path is not None else DEFAULT_PATH
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if not explicit:
            return ControllerConfig()
        raise ConfigError(f"{target}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{target}: cannot read: {exc}") from exc
    config = parse_config(text, target, newer_keys=True)
    if config.deep_checks.suite is not None:
        check_suite(config.deep_checks)
    if config.policy.dry_run:
        logging.getLogger(__name__).warning(
            '%s: [policy] dry_run is deprecated: write mode = "observe"', target
        )
    return config
