# Sourced by the sbatch scripts: where the repository is, the environment,
# and preemption handling.
#
# SLURM runs a copy of the batch script from its spool directory, so the
# repository is HARNESS_DIR, or the directory sbatch was called from.
set -euo pipefail
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
OVERRIDES=("$@")

REPO=${HARNESS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}
JOB_ID=${SLURM_JOB_ID:-dry-run}
# One directory per job: a requeued job has the same id, so it resumes.
RUN_DIR=${RUN_DIR:-$REPO/runs/slurm-$JOB_ID}
NPROC=${NPROC:-3}  # ranks per node

run() {  # print the command; run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

if [ "$DRY_RUN" = 0 ]; then
  EXTRAS="" source "$REPO/scripts/_env.sh"  # creates .venv on first use
fi
TORCHRUN=${TORCHRUN:-$REPO/.venv/bin/torchrun}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# SIGUSR1 (sent by --signal=B:USR1@120 before the time limit) or SIGTERM:
# ask the ranks to checkpoint (they get SIGTERM through srun and torchrun),
# wait for them, then requeue the job, which resumes from that checkpoint.
on_preempt() {
  echo "preempted: asking the job to checkpoint, then requeueing $JOB_ID"
  if [ -n "${STEP_PID:-}" ]; then
    kill -TERM "$STEP_PID" 2>/dev/null || true
    wait "$STEP_PID" || true
  fi
  scontrol requeue "$JOB_ID"
  exit 0
}

launch() {  # run the job step in the background so that the trap can fire
  if [ "$DRY_RUN" = 1 ]; then run "$@"; return; fi
  trap on_preempt USR1 TERM
  run "$@" &
  STEP_PID=$!
  wait "$STEP_PID"
}
