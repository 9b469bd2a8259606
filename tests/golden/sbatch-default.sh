#!/bin/bash
# moe-cdk training job mixtral-8x7b: 2 node(s) x 8 task(s), container 123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:latest.
# Rendered by moe_cdk.jobs.slurm_job.render_sbatch; submit with sbatch.
#SBATCH --job-name=mixtral-8x7b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --partition=gpu
#SBATCH --constraint=efa
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --time=48:00:00
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

# EFA and NCCL settings written by the node lifecycle scripts, when present.
efa_env_file=/etc/profile.d/moe-cdk-efa.sh
if [[ -r "$efa_env_file" ]]; then
    set +u
    # shellcheck source=/dev/null
    source "$efa_env_file"
    set -u
    log "sourced ${efa_env_file}"
fi

# enroot pulls the image from Amazon ECR on every node. Its credentials file (netrc format,
# ${HOME}/.config/enroot/.credentials, ENROOT_CONFIG_PATH as the lifecycle scripts set it)
# gets this registry's line, written by one task per node; enroot runs a password that starts
# with "$" at each import, as the user who pulls, so every pull gets a fresh ECR token (valid
# 12 hours) from the node's role. On a cluster with teams, IMDS (and so the role) is root's
# (lifecycle_scripts/imds_access.sh): the token then comes from the node's root-run helper
# moe-cdk installs there, through sudo. That trades a pull token (the role's ECR permissions,
# pull-only) for the member, never the role's credentials. A node without the helper (no
# teams) gets the token from the AWS CLI as before.
# shellcheck disable=SC2317  # run through declare -f by the srun below
write_enroot_credentials() {
    local registry="$1" region="$2" dir="${HOME}/.config/enroot" tmp
    mkdir -p "$dir"
    chmod 700 "$dir"
    tmp="$(mktemp "${dir}/.credentials.XXXXXX")"
    if [[ -f "${dir}/.credentials" ]]; then
        awk -v registry="$registry" '!($1 == "machine" && $2 == registry)' "${dir}/.credentials" >"$tmp"
    fi
    local helper="sudo -n /usr/local/bin/moe-ecr-password" cli="aws ecr get-login-password --region"
    # shellcheck disable=SC2016  # enroot, not this shell, runs the $(...)
    printf 'machine %s login AWS password $(%s %s 2>/dev/null || %s %s)\n' \
        "$registry" "$helper" "$region" "$cli" "$region" >>"$tmp"
    chmod 600 "$tmp"
    mv -f "$tmp" "${dir}/.credentials"
}
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --kill-on-bad-exit=1 \
    bash -c "$(declare -f write_enroot_credentials); write_enroot_credentials 123456789012.dkr.ecr.us-east-2.amazonaws.com us-east-2"
log "enroot credentials for 123456789012.dkr.ecr.us-east-2.amazonaws.com written on every node"

# The training profile this job runs, written where every node, and the container, sees it: beside
# the run's checkpoints. A requeued job writes the same text again, through a file of an unpredictable
# name (mktemp: never through a link planted at a name known in advance), renamed into place.
mkdir -p /fsx/checkpoints/mixtral-8x7b
train_config=/fsx/checkpoints/mixtral-8x7b/"train-${SLURM_JOB_ID}.yaml"
profile_tmp="$(mktemp "${train_config}.XXXXXX")"
cat >"$profile_tmp" <<'MOE_CDK_PROFILE'
# yaml-language-server: $schema=moe-train.schema.json
# A Mixtral-8x7B-like MoE (46.7B parameters, 12.9B active) on 2x ml.p5en.48xlarge (16x H200).
# Layout, following megatron-core's MoE guidance (EP x ETP inside the NVLink domain, ETP 1):
# tensor 2 (sequence-parallel) and expert 8 x expert_tensor 1 inside each node, so the expert
# all-to-all stays on NVLink; data-parallel 8 for the dense layers and 2 for the experts
# across the nodes. The distributed optimizer shards the fp32 main weights and Adam state
# over those data-parallel groups, and core-attention recompute drops the local spec's
# s x s attention scores. `moe-cdk plan --config config/default.yaml` sizes it.
max_steps: 50000
model:
  num_layers: 32
  hidden_size: 4096
  num_attention_heads: 32
  num_query_groups: 8
  ffn_hidden_size: 14336
  seq_length: 4096
  rotary_base: 1000000
moe:
  num_experts: 8
  top_k: 2
  aux_loss_coeff: 0.01
  z_loss_coeff: 0.001
  token_dispatcher: alltoall
parallel:
  tensor: 2
  pipeline: 1
  expert: 8
  expert_tensor: 1
data:
  prefixes: [/fsx/datasets/mixtral/train_text_document]
  tokenizer: /fsx/datasets/mixtral/tokenizer.json
  cache_dir: /fsx/datasets/mixtral/index-cache
  num_workers: 4
  prefetch_factor: 4
  pin_memory: true
optim:
  micro_batch_size: 1
  global_batch_size: 256
  lr: 0.0003
  min_lr: 0.00003
  warmup_steps: 2000
  decay_steps: 48000
  weight_decay: 0.1
  grad_clip: 1.0
  precision: auto
  distributed_optimizer: true
recompute:
  granularity: selective
  modules: [core_attn]
checkpoint:
  dir: /fsx/checkpoints/mixtral-8x7b
  save_interval: 500
  keep_last: 3
  async_save: true
metrics:
  file: /fsx/checkpoints/mixtral-8x7b/metrics.jsonl
  log_interval: 10
  prometheus_port: 9410  # not 9400: the DCGM exporter listens there on GPU nodes
  readiness_file: /tmp/moe-train/ready
  liveness_file: /tmp/moe-train/alive
MOE_CDK_PROFILE
mv -f "$profile_tmp" "$train_config"
log "training profile: ${train_config}"

# HyperPod auto-resume (SageMaker Developer Guide, "Automatic node recovery and auto-resume"):
# when a node fails, HyperPod replaces it and runs this srun step again, and the trainer
# resumes from its last checkpoint. Elsewhere the requeue below is the only retry.
auto_resume=()
if [[ -d /opt/sagemaker_cluster ]]; then
    auto_resume=(--auto-resume=1)
    log "HyperPod node: the training step runs with srun --auto-resume=1"
fi

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
    "${auto_resume[@]}" \
    --kill-on-bad-exit=1 \
    --container-image='123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:latest' \
    --container-mounts=/fsx:/fsx \
    moe-train \
    --config "$train_config" &
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
