#!/usr/bin/env bash
# Run the whole test suite: installs what it needs first (scripts/setup.sh, idempotent),
# then unit and integration tests. Integration tests start their own local Slurm
# clusters and need root. Extra arguments go to pytest (one run, as given).
#
# Without arguments the suite runs in two lanes at once, each on clusters of its own:
# the drills on the service cluster (marker `services`, mostly waiting on Slurm and
# the agents) and everything else. The second lane's output follows the first's.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1

# pytest exits 5 when it collected no test: that is not a failure of the suite.
pytest_rc() {
	local rc=$1
	if [ "$rc" = 5 ]; then
		echo "no tests collected"
		rc=0
	fi
	return "$rc"
}

if [ "$#" -gt 0 ]; then
	.venv/bin/pytest -q -p no:cacheprovider "$@"
	pytest_rc $?
	exit $?
fi

# Each lane ends with its 20 slowest tests: the CI budget is kept with these figures.
# The layering contracts in pyproject.toml (docs/architecture.md): a new forbidden
# import fails the suite before any test runs.
echo "== layering (lint-imports)"
.venv/bin/lint-imports --no-cache || { echo "layering contracts broken: see above"; exit 1; }

lane_log=$(mktemp /tmp/hyperpod-tests-services.XXXXXX)
trap 'rm -f "$lane_log"' EXIT
.venv/bin/pytest -q -p no:cacheprovider --durations=20 -m services >"$lane_log" 2>&1 &
lane_pid=$!
echo "== lane 1: unit tests and the other integration tests"
.venv/bin/pytest -q -p no:cacheprovider --durations=20 -m "not services"
pytest_rc $?
rc_main=$?
wait "$lane_pid"
pytest_rc $?
rc_lane=$?
echo "== lane 2: drills on the service cluster (-m services)"
cat "$lane_log"
if [ "$rc_main" != 0 ] || [ "$rc_lane" != 0 ]; then
	echo "test lanes failed: rc $rc_main (unit and others), $rc_lane (service drills)"
	exit 1
fi
