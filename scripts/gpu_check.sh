#!/usr/bin/env bash
# This project on one GPU in one command (scripts/gpu_check.py says what it runs and writes):
#
#   scripts/gpu_check.sh [--bundle DIR] [gpu_check.py's options: --out DIR, --device cpu, ...]
#
# --bundle DIR: first install the offline bundle that scripts/offline_bundle.py wrote into DIR
# (wheels for what the machine lacks, no index) into a folder of its own, then run this checkout
# from its source (PYTHONPATH), uninstalled: a machine with no network and no pip access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
if [ -n "$bundle" ]; then
    site="${TMPDIR:-/tmp}/rllib-arpo-bundle"
    echo "installing the bundle $bundle into $site"
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$bundle"/*.whl
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu_check.py "${args[@]}"
