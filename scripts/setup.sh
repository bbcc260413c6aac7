#!/usr/bin/env bash
# Install everything hyperpod-agent needs on Debian 12, as root: Slurm, munge, the
# compiler for the SPANK plugin, test tools, and a virtualenv in .venv with the
# package installed in editable mode. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "setup: run as root (it installs Slurm and munge with apt-get)" >&2
	exit 1
fi

APT_PACKAGES="slurmctld slurmd slurm-client munge libslurm-dev gcc make libc6-dev
	util-linux procps iproute2 kmod systemd fuse3 python3-venv prometheus postgresql"
missing=""
for p in $APT_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
	# Keep the packages' init scripts from starting the machine's own munged and
	# slurm daemons: the local cluster runs its own.
	made_policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	for i in 1 2 3; do apt-get update -q && break; sleep $((i * 5)); done
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
	[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
	"$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[dev]'
# The checkpoint tests and benchmark use this exact CPU build of torch.
.venv/bin/pip install -q 'torch==2.13.0' || echo "setup: torch==2.13.0 not available; torch tests will be skipped" >&2
make -s -C spank_plugin
echo "setup: done ($(.venv/bin/hyperpod --version), $(/usr/sbin/slurmctld -V))"
