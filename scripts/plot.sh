#!/usr/bin/env bash
# Plot: scripts/plot.sh RUN_DIR [RUN_DIR ...] --out curves.png [--aggregate iqm]   (or --presets ROOT, or --bench FILE.json --out FILE.png)
# Creates .venv on first use, like train.sh; the run directories are read from where you stand.
here=$PWD
EXTRAS=${EXTRAS:-}
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$here"
exec "$VENV/bin/python" "$ROOT/scripts/plot.py" "$@"
