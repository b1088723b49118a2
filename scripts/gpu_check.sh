#!/usr/bin/env bash
# The GPU check (docs/gpu.md): real torchrun runs with a CUDA trainer, sync=nccl where there are GPUs
# enough, the update and weight sync benchmarks on CUDA. One table, and JSON, in --out.
#
#   scripts/gpu_check.sh [--out DIR]        # on a GPU machine: under 8 minutes on one H200
#   scripts/gpu_check.sh --dry-run          # every step on the CPU: proves the script without a GPU
#   scripts/gpu_check.sh --fetch-wheels     # with internet: the wheels a GPU image lacks, into .whl/
#
# Which Python: $PYTHON if set; else the first of .venv/bin/python and python3 whose torch sees a GPU
# (a GPU image's own CUDA torch: a machine without internet cannot install one); --dry-run: .venv,
# made as scripts/train.sh makes it. What that Python lacks of the harness's dependencies (tensordict,
# hydra-core, omegaconf, gymnasium, ...) is installed with pip --target into $SITE (default
# /tmp/harness-gpu-site), from the wheels in $WHEELHOUSE (default .whl/) with no network, else
# from the package index. Without a GPU (and without --dry-run) it says what it skipped and exits 0.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
WHEELHOUSE=${WHEELHOUSE:-$ROOT/.whl}
SITE=${SITE:-/tmp/harness-gpu-site}
# What a GPU image usually lacks, at the versions constraints.txt pins (all pure Python: any Python 3 takes them).
NEEDED="tensordict pyvers hydra-core omegaconf antlr4-python3-runtime gymnasium Farama-Notifications ale-py opencv-python-headless"
MODULES="tensordict hydra omegaconf gymnasium"

pinned() {  # "name==version" for each name, from constraints.txt
  local name spec
  for name in "$@"; do
    spec=$(grep -i -m1 "^${name}==" constraints.txt || true)
    echo "${spec:-$name}"
  done
}

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$WHEELHOUSE"
  PY=${PYTHON:-python3}
  # antlr4-python3-runtime 4.9.3 (hydra's parser) is published as source only: build its wheel here.
  "$PY" -m pip wheel -q --no-deps -w "$WHEELHOUSE" $(pinned antlr4-python3-runtime)
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELHOUSE" $(pinned ${NEEDED/antlr4-python3-runtime/})
  ls -1 "$WHEELHOUSE"
  echo "carry $WHEELHOUSE to the GPU machine; scripts/gpu_check.sh installs from it without the network"
  exit 0
fi

sees_gpu() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [[ " $* " == *" --dry-run "* ]]; then
  EXTRAS="test,atari"
  source scripts/_env.sh  # .venv with the CPU torch, as scripts/test.sh makes it
  PY=$VENV/bin/python
else
  PY=""
  for candidate in "$ROOT/.venv/bin/python" "$(command -v python3 || true)"; do
    if [ -x "$candidate" ] && sees_gpu "$candidate"; then PY=$candidate; break; fi
  done
  if [ -z "$PY" ]; then
    echo "gpu_check: no Python here has a torch that sees a GPU (.venv/bin/python, python3), so nothing was checked." \
         "Skipped: 0 the GPU test tier, 1 the torchrun runs with a CUDA trainer, 2 sync=nccl, 3 the CUDA update" \
         "benchmark, 4 the CUDA weight sync benchmark. On a GPU machine: PYTHON=<a python with CUDA torch>;" \
         "here: scripts/gpu_check.sh --dry-run runs every step on the CPU."
    exit 0
  fi
fi

missing=$("$PY" - $MODULES <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "gpu_check: $PY lacks $missing; installing the harness's dependencies into $SITE" >&2
  mkdir -p "$SITE"
  if compgen -G "$WHEELHOUSE/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" "$WHEELHOUSE"/*.whl
  elif ! "$PY" -m pip install -q --no-deps --disable-pip-version-check --target "$SITE" $(pinned $NEEDED); then
    echo "gpu_check: could not install $(pinned $NEEDED) (no network?). On a machine with internet run" \
         "scripts/gpu_check.sh --fetch-wheels, carry .whl/ here, and run this again." >&2
    exit 2
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check: $PY, torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')" >&2
exec "$PY" scripts/gpu_check.py "$@"
