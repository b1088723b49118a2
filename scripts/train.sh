#!/usr/bin/env bash
# Train: scripts/train.sh [hydra overrides...]
#   NPROC=3 (default): torchrun with 1 trainer + 2 collectors; NPROC=1: plain python.
#   MAX_RESTARTS=K: torchrun restarts the job up to K times after a rank dies.
#   EXTRAS=video (or mujoco, or both: EXTRAS=mujoco,video): install those extras first.
# Ctrl-C: checkpoint at the next safe point and stop (it prints how to resume); twice: stop at once.
# Example: NPROC=5 scripts/train.sh env=acrobot seed=3 collector.total_frames=200000
EXTRAS=${EXTRAS:-}
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
NPROC=${NPROC:-3}
if [ "$NPROC" = 1 ]; then
  exec "$VENV/bin/python" -m harness.train "$@"
fi
# harness.launch is torchrun (same arguments) with a clean Ctrl-C: see harness/launch.py.
exec "$VENV/bin/python" -m harness.launch --standalone --nproc_per_node="$NPROC" --max-restarts="${MAX_RESTARTS:-0}" \
  -m harness.train "$@"
