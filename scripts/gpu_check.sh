#!/usr/bin/env bash
# GPU checks of the weight sync schemes (NCCL; GPU trainer with CPU collectors).
# Skips, saying why, on a machine without CUDA. On a GPU machine, set TORCH_SPEC
# to a CUDA build of torch first if .venv does not exist yet.
EXTRAS=""
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" scripts/gpu_check.py "$@"
