"""Prometheus metrics of the checkpoint library (one module declares them all)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SAVE_BLOCKED = Histogram(
    "hyperpod_checkpoint_save_blocked_seconds",
    "Time a save kept the training loop waiting (staging copy plus any back-pressure).",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BYTES_WRITTEN = Counter(
    "hyperpod_checkpoint_written_bytes_total", "Shard bytes written, by tier.", ["tier"]
)
TIER_FAILURES = Counter(
    "hyperpod_checkpoint_tier_failures_total", "Saves that failed on a tier.", ["tier"]
)
RESTORES = Counter(
    "hyperpod_checkpoint_restores_total", "Successful restores, by the tier read.", ["tier"]
)
FALLBACKS = Counter(
    "hyperpod_checkpoint_fallbacks_total",
    "Shards skipped at restore because they were missing or corrupt, by tier.",
    ["tier"],
)
