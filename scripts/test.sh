#!/usr/bin/env bash
# Test: scripts/test.sh [pytest args...]   (creates .venv with the test extras first)
EXTRAS="test,mujoco,offline,video,sweep,minatar,popgym,atari,envpool,plot"
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest "$@"
