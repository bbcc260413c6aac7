#!/usr/bin/env bash
# Provision this node from provisioning_parameters.json. Run on every new instance (and
# safe to run again: a second run changes nothing). See lifecycle_scripts/README.md.
#
#   on_create.sh [--params FILE] [--node NAME | --resource-config FILE] [--prefix DIR]
#                [--package SPEC] [--python PATH] [any `hyperpod provision apply` flag]
#
# Everything not listed above (--dry-run, --skip-verify, --skip-install, --instance-id,
# --source, --verify-timeout) is passed through to `hyperpod provision apply`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
params="$here/provisioning_parameters.json"
resource_config=""
node=""
prefix=""
package="$repo"
python=""
dry_run=0
skip_install=0
passthrough=()

die() { echo "on_create.sh: error: $*" >&2; exit 2; }
log() { echo "on_create.sh: $*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --params) [[ $# -ge 2 ]] || die "--params needs a FILE"; params="$2"; shift 2 ;;
        --node) [[ $# -ge 2 ]] || die "--node needs a NAME"; node="$2"; shift 2 ;;
        --resource-config) [[ $# -ge 2 ]] || die "--resource-config needs a FILE"
            resource_config="$2"; shift 2 ;;
        --prefix) [[ $# -ge 2 ]] || die "--prefix needs a DIR"; prefix="$2"; shift 2 ;;
        --package) [[ $# -ge 2 ]] || die "--package needs a SPEC"; package="$2"; shift 2 ;;
        --python) [[ $# -ge 2 ]] || die "--python needs a PATH"; python="$2"; shift 2 ;;
        --dry-run) dry_run=1; passthrough+=("$1"); shift ;;
        --skip-install) skip_install=1; passthrough+=("$1"); shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) passthrough+=("$1"); shift ;;
    esac
done

[[ -f "$params" ]] || die "$params: no such file"
if [[ -z "$node" && -z "$resource_config" ]]; then
    resource_config="$here/resource_config.json"
    [[ -f "$resource_config" ]] || die "give --node NAME or --resource-config FILE"
fi
target=()
if [[ -n "$node" ]]; then target=(--node "$node"); else target=(--resource-config "$resource_config"); fi
prefix_args=()
if [[ -n "$prefix" ]]; then prefix_args=(--prefix "$prefix"); fi

find_python() {
    local candidate
    for candidate in "$python" python3.13 python3.12 python3.11 python3; do
        [[ -n "$candidate" ]] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
        then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

# pip talks to the network: retry with exponential back-off, bounded.
install_into() {
    local venv="$1" py attempt delay=2
    py="$(find_python)" || die "no python3 >= 3.11 with the venv module (use --python PATH)"
    [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
    for attempt in 1 2 3 4 5; do
        if timeout 900 "$venv/bin/python" -m pip install --quiet "$package"; then
            return 0
        fi
        [[ $attempt -lt 5 ]] || break
        log "pip install failed (attempt $attempt of 5); retrying in ${delay}s"
        sleep "$delay"
        delay=$((delay * 2))
    done
    die "could not install $package into $venv"
}

venv="${prefix%/}/opt/hyperpod/venv"
if [[ -x "$venv/bin/hyperpod" ]]; then
    hyperpod="$venv/bin/hyperpod"
elif [[ $skip_install -eq 1 ]]; then
    hyperpod="$(command -v hyperpod)" || die "--skip-install: no hyperpod on PATH or in $venv"
elif [[ $dry_run -eq 1 ]]; then
    # A dry run writes nothing under the prefix: a throw-away venv runs the tool.
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    install_into "$scratch/venv"
    hyperpod="$scratch/venv/bin/hyperpod"
else
    log "installing $package into $venv"
    install_into "$venv"
    hyperpod="$venv/bin/hyperpod"
fi

# --source first, so a --source among the pass-through flags wins (the last one counts).
cmd=("$hyperpod" provision apply "$params" "${target[@]}" --source "$repo" --package "$package")
cmd+=("${prefix_args[@]}" "${passthrough[@]}")
if [[ $dry_run -eq 1 && -n "${scratch:-}" ]]; then
    "${cmd[@]}"  # not exec: the trap removes the scratch venv afterwards
else
    exec "${cmd[@]}"
fi
