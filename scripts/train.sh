#!/usr/bin/env bash
# Train: scripts/train.sh [hydra overrides...]
#   NPROC=3 (default): torchrun with 1 trainer + 2 collectors; NPROC=1: plain python.
#   MAX_RESTARTS=K: torchrun restarts the job up to K times after a rank dies.
#   EXTRAS=video (or mujoco, or both: EXTRAS=mujoco,video): install those extras first.
# Ctrl-C: checkpoint at the next safe point and stop (it prints how to resume); twice: stop at once.
# Example: NPROC=5 scripts/train.sh env=acrobot seed=3 collector.total_frames=200000
EXTRAS=${EXTRAS:-}
NPROC=${NPROC:-3}
# Checked before the set-up, so that a typo costs nothing.
if ! [[ "$NPROC" =~ ^[0-9]+$ ]] || [ "$NPROC" -lt 1 ]; then
  echo "NPROC=$NPROC: the number of ranks to start must be a whole number >= 1 (1: one process trains and collects; 3: 1 trainer + 2 collectors)" >&2
  exit 2
fi
if ! [[ "${MAX_RESTARTS:-0}" =~ ^[0-9]+$ ]]; then
  echo "MAX_RESTARTS=$MAX_RESTARTS: torchrun's restarts after a rank dies must be a whole number >= 0" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
if [ "$NPROC" = 1 ]; then
  exec "$VENV/bin/python" -m harness.train "$@"
fi
# harness.cli.launch is torchrun (same arguments) with a clean Ctrl-C: see harness/cli/launch.py.
exec "$VENV/bin/python" -m harness.cli.launch --standalone --nproc_per_node="$NPROC" --max-restarts="${MAX_RESTARTS:-0}" \
  -m harness.train "$@"
