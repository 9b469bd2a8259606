#!/bin/bash
# moe-cdk training job moe-tiny: 2 node(s) x 1 task(s), local (CPU, gloo).
# Rendered by moe_cdk.jobs.slurm_job.render_sbatch; submit with sbatch.
#SBATCH --job-name=moe-tiny
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --partition=ci
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append

set -euo pipefail

log() { printf '%s slurm_job[%s]: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "${SLURM_JOB_ID:-?}" "$*" >&2; }

restart_count="${SLURM_RESTART_COUNT:-0}"
log "job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: SLURM_RESTART_COUNT=${restart_count}"

# The ranks meet on the first node of the allocation. Its NodeAddr, not its name: the name
# need not resolve (several virtual nodes on one host share one address).
first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')"
MASTER_ADDR="$(scontrol show node "$first_node" -o | tr ' ' '\n' | awk -F= '$1 == "NodeAddr" {print $2}')"
export MASTER_ADDR="${MASTER_ADDR:-$first_node}"
export MASTER_PORT=29500
log "rendezvous ${MASTER_ADDR}:${MASTER_PORT} (${first_node})"

# USR1 (--signal=B:USR1@N, scancel --batch --signal=USR1) and TERM (scancel, scontrol
# requeue, preemption) reach this shell; the ranks must see USR1 to save a checkpoint and
# exit 143. Checked on Slurm 22.05 with two nodes: srun relays a USR1 it receives to its
# step, so `kill -USR1 "$srun_pid"` reaches every rank on every node. `scancel
# --signal=USR1 "$SLURM_JOB_ID.0"` does the same through slurmctld, but that is an RPC
# that can fail or lag, so the local kill is used. Either way slurmstepd signals every
# process of the step, the ranks' helper processes included (the trainer's helpers ignore
# the stop signals). A TERM from Slurm (scancel, scontrol requeue, preemption) reaches the
# ranks and srun at once; srun then stops waiting for the step ("forcing job termination":
# its launch plugin turns the TERM into slurm_step_launch_abort, not a SIGKILL) and slurmd
# kills what is left KillWait seconds after the TERM (GraceTime for a preemption), so a
# save on TERM has that long. Measured on Slurm 22.05 (tests/jobs/test_slurm.py): the
# ranks save at the step they stopped at and exit 143.
# USR1 and TERM reach this shell; the traps pass them on to the job step.
srun_pid=""
# shellcheck disable=SC2317  # only the traps below call it
forward_signal() {
    log "got $1: asking the trainer to save a checkpoint and stop"
    if [[ -n "$srun_pid" ]]; then
        kill -USR1 "$srun_pid" 2>/dev/null || true
    fi
}
trap 'forward_signal USR1' USR1
trap 'forward_signal TERM' TERM

# srun reports each task that fails on the job's stderr; what it reports from here on is this run's.
job_stderr="$( (scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null || true) | tr ' ' '\n' \
    | awk -F= '$1 == "StdErr" {print $2}')"
job_stderr_offset="$(stat -c %s "$job_stderr" 2>/dev/null || echo 0)"
srun \
    --kill-on-bad-exit=1 \
    python3 -m moe_cdk.cli.train \
    --config training/configs/tiny.yaml \
    --set parallel.expert=2 \
    --max-steps 40 &
srun_pid=$!

# `wait` returns early (128 + signal) whenever a trapped signal arrives: keep waiting until
# srun itself has exited. kill -0 still succeeds on an exited but unreaped srun, so the
# next `wait` collects its real exit status.
rc=0
while true; do
    wait "$srun_pid" && rc=0 || rc=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done
srun_pid=""
log "trainer exited with ${rc}"

max_requeues=10
# shellcheck disable=SC2317  # called below
permanent() { local rc="$1"; (( rc < 128 )); }
# srun exits with the highest of its tasks' codes. Once a task exits non-zero, --kill-on-bad-exit TERMs the
# others, and their 143 would hide a task's permanent exit (ranks finish their checks seconds apart): the
# code srun reported for a task ("srun: error: NODE: task N: Exited with exit code C") decides then.
if (( rc != 0 )) && ! permanent "$rc" && [[ -r "$job_stderr" ]]; then
    reported='s/^srun: error: .*: tasks\{0,1\} [0-9,-]*: Exited with exit code \([0-9]*\)$/\1/p'
    for task_rc in $(tail -c +"$(( job_stderr_offset + 1 ))" "$job_stderr" | sed -n "$reported" || true); do
        if permanent "$task_rc"; then
            log "a task exited with ${task_rc}; srun's ${rc} is the other tasks stopped after it"
            rc="$task_rc"
            break
        fi
    done
fi
if (( rc == 0 )); then
    exit 0
elif permanent "$rc"; then
    log "permanent failure (exit ${rc}; 2 = bad configuration): not requeueing"
    exit "$rc"
fi
# Is Slurm ending this job already? A scancel, a preemption, `scontrol requeue` or the time
# limit leave it COMPLETING while this script still runs (Slurm 22.05). Slurm counts its own
# requeue at once (Restarts above SLURM_RESTART_COUNT); a scancel does not, and must not be
# undone by a requeue from here: the checkpoint the ranks saved resumes the next submission.
# (The time limit is met earlier by --signal=B:USR1, which leaves the job RUNNING.)
job_fields="$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null || true)"
job_state="$(tr ' ' '
' <<<"$job_fields" | awk -F= '$1 == "JobState" {print $2}')"
slurm_restarts="$(tr ' ' '
' <<<"$job_fields" | awk -F= '$1 == "Restarts" {print $2}')"
if [[ -n "$job_state" && "$job_state" != RUNNING ]]; then
    if (( ${slurm_restarts:-0} > restart_count )); then
        log "Slurm is requeueing the job itself (restart ${slurm_restarts}); the next run resumes from its checkpoint"
        exit 0
    fi
    log "Slurm is ending the job (JobState ${job_state}: scancel, or its time limit): not requeueing;" \
        "submit it again to resume from the last checkpoint"
    exit "$rc"
fi
if (( restart_count < max_requeues )); then
    log "retryable failure (exit ${rc}): requeueing, restart $(( restart_count + 1 )) of ${max_requeues}"
    # The requeue also ends this run (Slurm sends TERM); a job that Slurm is already
    # requeueing (scontrol requeue from outside) refuses a second request, which is fine.
    scontrol requeue "$SLURM_JOB_ID" || log "scontrol requeue ${SLURM_JOB_ID} failed"
    exit 0
else
    log "retryable failure (exit ${rc}) but already requeued ${restart_count} times: giving up"
    exit "$rc"
fi
