# Sourced by train.sh and test.sh: create .venv if it is missing and install
# the project into it (editable) with the extras named in $EXTRAS.
#
# torch is installed first and pinned (TORCH_SPEC), so that resolving the
# project's other dependencies never pulls a multi-GB CUDA build onto a CPU
# machine. On a GPU cluster, set TORCH_SPEC (and PIP_INDEX_URL if needed) to
# the CUDA build you want before the first run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-}
PY=${PYTHON:-python3}

# A stamp per set of extras, newer than pyproject.toml, means "installed".
# Any install also covers the plain package (EXTRAS="").
stamp="$VENV/.installed-${EXTRAS:-base}"
if [ -z "$EXTRAS" ]; then
  newest=$(ls -t "$VENV"/.installed-* 2>/dev/null | head -n 1 || true)
  stamp=${newest:-$stamp}
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  stamp="$VENV/.installed-${EXTRAS:-base}"
  echo "installing the harness into $VENV (extras: ${EXTRAS:-none}; $TORCH_SPEC)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$stamp"
fi
# Oversubscribed intra-op threads make every rank slower when several share a machine.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
