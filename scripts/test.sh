#!/usr/bin/env bash
# Run the whole test suite: installs what it needs first (scripts/setup.sh, idempotent),
# then unit and integration tests. Integration tests start their own local Slurm
# clusters and need root. Extra arguments go to pytest (one run, as given).
#
# Without arguments the suite runs in three lanes at once, each on clusters of its own:
# the drills on the service cluster (marker `services`, mostly waiting on Slurm and
# the agents), the soak drills (marker `soak`) and everything else. The other lanes'
# output follows the first's.
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

# The layering contracts in pyproject.toml (docs/architecture.md): a new forbidden
# import fails the suite before any test runs.
echo "== layering (lint-imports)"
.venv/bin/lint-imports --no-cache || { echo "layering contracts broken: see above"; exit 1; }

# Three lanes at once, each on local clusters of its own: the drills on the service
# cluster, the soak drills (long runs at the shipped cadences, mostly waiting) and the
# rest. Each lane ends with its 20 slowest tests: the CI budget is kept with these figures.
services_log=$(mktemp /tmp/hyperpod-tests-services.XXXXXX)
soak_log=$(mktemp /tmp/hyperpod-tests-soak.XXXXXX)
trap 'rm -f "$services_log" "$soak_log"' EXIT
lane() { # lane MARKER: one pytest run over the tests with that marker expression
	.venv/bin/pytest -q -p no:cacheprovider --durations=20 -m "$1"
}
lane services >"$services_log" 2>&1 &
services_pid=$!
lane soak >"$soak_log" 2>&1 &
soak_pid=$!
echo "== lane 1: unit tests and the other integration tests"
lane "not services and not soak"
pytest_rc $?
rc_main=$?
wait "$services_pid"
pytest_rc $?
rc_services=$?
wait "$soak_pid"
pytest_rc $?
rc_soak=$?
echo "== lane 2: drills on the service cluster (-m services)"
cat "$services_log"
echo "== lane 3: soak drills at the shipped cadences (-m soak)"
cat "$soak_log"
if [ "$rc_main" != 0 ] || [ "$rc_services" != 0 ] || [ "$rc_soak" != 0 ]; then
	echo "test lanes failed: rc $rc_main (unit and others), $rc_services (service drills)," \
		"$rc_soak (soak drills)"
	exit 1
fi
