#!/usr/bin/env bash
# Run every SOTA preset (or --only some, --frames N to cap) and write docs/results.md.
EXTRAS="mujoco,atari"  # the MuJoCo and Atari presets
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" scripts/sota_check.py "$@"
