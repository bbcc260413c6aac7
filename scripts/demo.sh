#!/usr/bin/env bash
# The README's first command: install everything (idempotent), then run the demo
# on a local Slurm cluster. Extra arguments go to `hyperpod demo` (e.g. --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/hyperpod demo "$@"
