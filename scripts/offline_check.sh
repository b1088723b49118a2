#!/usr/bin/env bash
# Make a medium dataset, run IQL and CQL on it, write their section of docs/results.md (scripts/offline_check.py --help).
EXTRAS="mujoco"
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" scripts/offline_check.py "$@"
