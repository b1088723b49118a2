# Sourced by train.sh and test.sh: create .venv if it is missing and install
# the project into it (editable) with the extras named in $EXTRAS.
#
# torch is installed first, pinned (TORCH_SPEC), from TORCH_INDEX_URL when it
# is set, so that resolving the project's other dependencies never swaps in
# another build. Which build that is depends on the index: on Linux, PyPI's
# torch is the CUDA build (several GB; it runs on CPUs too); the CPU-only build
# is TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu. Everything after
# torch comes from pip's own index (PIP_INDEX_URL and pip's config are honoured).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
EXTRAS=${EXTRAS:-}
PY=${PYTHON:-python3}

# A stamp per install, named after its extras and newer than pyproject.toml,
# means "installed": any stamp whose extras include every one asked for will
# do (EXTRAS="" takes any), so that the test install also covers train.sh's.
installed() {
  local s e have
  for s in "$VENV"/.installed-*; do
    [ -f "$s" ] && [ "$s" -nt "$ROOT/pyproject.toml" ] && [ "$s" -nt "$ROOT/constraints.txt" ] \
      || continue
    have=",${s##*/.installed-},"
    for e in ${EXTRAS//,/ }; do
      case "$have" in *",$e,"*) ;; *) continue 2 ;; esac
    done
    return 0
  done
  return 1
}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if ! installed; then
  echo "installing the harness into $VENV (extras: ${EXTRAS:-none};" \
       "$TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL})" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
  # constraints.txt: the versions CI tested, so that a new release elsewhere cannot change a fresh
  # install.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$ROOT/constraints.txt" \
    -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$VENV/.installed-${EXTRAS:-base}"
fi
# Oversubscribed intra-op threads make every rank slower when several share a machine.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
