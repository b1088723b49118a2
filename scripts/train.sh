#!/usr/bin/env bash
# Train: scripts/train.sh [harness train's flags] [hydra overrides...]   (creates .venv first)
#   After the set-up it is `harness train` (harness train --help says more): 3 processes by default,
#   1 trainer + 2 collectors through torchrun; --nproc 1: one process that trains and collects.
#   NPROC=N, MAX_RESTARTS=K: the same as --nproc N, --max-restarts K (torchrun's restarts).
#   EXTRAS=video (or mujoco, or both: EXTRAS=mujoco,video): install those extras first.
# Ctrl-C: checkpoint at the next safe point and stop (it prints how to resume); twice: stop at once.
# Example: scripts/train.sh --nproc 5 env=acrobot seed=3 collector.total_frames=200000
EXTRAS=${EXTRAS:-}
# Checked before the set-up, so that a typo costs nothing.
if [ -n "${NPROC:-}" ] && { ! [[ "$NPROC" =~ ^[0-9]+$ ]] || [ "$NPROC" -lt 1 ]; }; then
  echo "NPROC=$NPROC: the number of ranks to start must be a whole number >= 1" \
       "(1: one process trains and collects; 3: 1 trainer + 2 collectors)" >&2
  exit 2
fi
if ! [[ "${MAX_RESTARTS:-0}" =~ ^[0-9]+$ ]]; then
  echo "MAX_RESTARTS=$MAX_RESTARTS: torchrun's restarts after a rank dies must be" \
       "a whole number >= 0" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
flags=()
if [ -n "${NPROC:-}" ]; then flags+=(--nproc "$NPROC"); fi
# One process has no torchrun to restart it: MAX_RESTARTS applies to torchrun's launches only.
if [ -n "${MAX_RESTARTS:-}" ] && [ "${NPROC:-3}" != 1 ]; then
  flags+=(--max-restarts "$MAX_RESTARTS")
fi
# python -m harness: the `harness` command, with this checkout's package (the current directory
# comes first), whichever checkout .venv's editable install names.
exec "$VENV/bin/python" -m harness train ${flags[@]+"${flags[@]}"} "$@"
