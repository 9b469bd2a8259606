"""The Slurm batch script that runs the trainer, rendered from a ``SlurmJobSpec``.

``render_sbatch(spec)`` returns a bash script for ``sbatch``. The script:

* finds the rendezvous host: the ``NodeAddr`` of the first node of the allocation, which is
  right both for real nodes and for several virtual nodes on one host;
* starts ``srun`` (one task per rank; the trainer reads ``SLURM_PROCID`` and friends) in the
  background and ``wait``s on it, because bash runs a trap only between commands or while it
  ``wait``s, and ``--signal=B:USR1@N`` signals the batch shell only;
* forwards USR1 and TERM to the job step as USR1, so the trainer saves a checkpoint at the
  next step boundary and exits 143;
* on a HyperPod node (``/opt/sagemaker_cluster`` exists), runs the training step with
  ``srun --auto-resume=1``: after HyperPod replaces a failed node it runs the step again, and
  the trainer resumes from its last checkpoint;
* for an image in Amazon ECR, writes the enroot credentials that let every node pull it;
* writes the training profile it carries (``train_profile``) beside the run's checkpoints, on the
  file system every node shares, and runs the trainer on that copy;
* maps the trainer's exit code onto Slurm: 0 ends the job, 1 to 127 are permanent failures
  (2 is a bad configuration) and end it with that code, 128 to 255 are retryable (143
  preempted or signalled, 138 crashed, 137 killed) and requeue the job with
  ``scontrol requeue`` until it has been requeued ``max_requeues`` times.

Standard library only (no CDK): the script is rendered by the CLI and by the tests.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, Problem, problem, raise_if_any
from moe_cdk.jobs.profile import JobProfile, load_job_profile
from moe_cdk.rules.neuron import moe_train_refusal
from moe_cdk.rules.teams import TEAMS_FOLDER, job_team
from moe_cdk.schema.config import Config, nodes_of

# Slurm's --time formats (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes and days-hours:minutes:seconds; or UNLIMITED / INFINITE.
_TIME_LIMIT = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")
_TIME_ALLOWED = (
    "minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
    "days-hours:minutes:seconds, UNLIMITED or INFINITE"
)
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# A registry host in an image reference: it has a dot or a port, or is localhost (Docker's rule).
_REGISTRY = re.compile(r"^(localhost|[^/]*[.:][^/]*)$")
# A private Amazon ECR registry (Amazon ECR User Guide, "Private registry"): the region is in the name.
_ECR_REGISTRY = re.compile(r"^\d{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
# How AWS's sample batch scripts recognize a HyperPod node (aws-samples/awsome-distributed-training,
# 3.test_cases/pytorch/FSDP/slurm/llama3_1_8b-training.sbatch at 7217859).
HYPERPOD_MARKER = "/opt/sagemaker_cluster"


@dataclass(frozen=True, kw_only=True)
class SlurmJobSpec:
    """One training job on a Slurm cluster: what ``render_sbatch`` turns into a batch script."""

    job_name: str
    """Slurm job name (``--job-name``): letters, digits, ``.``, ``_`` and ``-``."""
    nodes: int
    """Number of nodes (``--nodes``), at least 1."""
    tasks_per_node: int
    """Trainer processes per node (``--ntasks-per-node``): one per GPU, or 1 on a CPU node."""
    gpus_per_node: int | None = None
    """GPUs per node (``--gpus-per-node``); None (or a local job) requests none."""
    partition: str | None = None
    """Slurm partition (``--partition``); None uses the cluster's default partition."""
    constraint: str | None = None
    """Node features the nodes must have (``--constraint``), e.g. ``efa``."""
    exclusive: bool = False
    """Whole nodes only (``--exclusive``): no other job shares them."""
    time_limit: str
    """Wall-clock limit (``--time``) in Slurm's format, e.g. ``48:00:00`` or ``2-00:00:00``."""
    signal_lead_seconds: int = 300
    """USR1 reaches the batch shell this many seconds before ``time_limit`` (``--signal=B:USR1@N``),
    so the trainer can save a checkpoint; it must cover one step plus one checkpoint save."""
    requeue: bool = True
    """Let Slurm requeue the job (``--requeue``): after a node failure, and when the script
    requeues itself after a retryable exit."""
    qos: str | None = None
    """Quality of service (``--qos``)."""
    account: str | None = None
    """The account the job is charged to (``--account``): with teams, the team's."""
    nice: int | None = None
    """Priority adjustment (``--nice``): positive values lower the job's priority."""
    container_image: str | None = None
    """Image the ranks run in, through pyxis/enroot (``srun --container-image``), e.g. an ECR URI.
    Exactly one of ``container_image`` and ``local`` is set."""
    container_mounts: str | None = None
    """Bind mounts into the container (``srun --container-mounts``), e.g. ``/fsx:/fsx``."""
    train_config: str | None = None
    """The trainer's YAML configuration, as a path on the nodes (inside the container when there is one).
    Exactly one of ``train_config`` and ``train_profile`` is set."""
    train_profile: str | None = None
    """The trainer's YAML configuration itself: the script writes it to ``<profile_dir>/train-<job id>.yaml``
    before the first step and runs the trainer on that file (``jobs/profile.py``)."""
    profile_dir: str = "."
    """Where the script writes ``train_profile``: a folder every node sees at the same path, inside the container
    too, e.g. the run's checkpoint folder on /fsx. Relative to the directory the job was submitted from."""
    train_args: tuple[str, ...] = ()
    """Further trainer arguments, e.g. ``("--max-steps", "100", "--set", "parallel.expert=8")``."""
    local: bool = False
    """A CPU-only cluster: no container, no GPUs, no EFA environment; the ranks talk over gloo."""
    python: str = "python3"
    """The interpreter that runs ``moe_cdk.cli.train`` when ``local``."""
    master_port: int = 29500
    """TCP port on the first node where the ranks meet (``MASTER_PORT``)."""
    output: str = "%x-%j.out"
    """Where the job's stdout and stderr go (``--output``), appended to across requeues."""
    efa_env_file: str = "/etc/profile.d/moe-cdk-efa.sh"
    """File of EFA/NCCL variables that the script sources when it exists (not when ``local``; empty: none)."""
    max_requeues: int = 10
    """How many times the script requeues the job after a retryable exit before it gives up."""
    hyperpod_marker: str = HYPERPOD_MARKER
    """A folder that exists only on HyperPod nodes; where it does, the training step runs with
    ``srun --auto-resume=1`` (not when ``local``)."""
    nsys_rank: int | None = None
    """Run this rank under Nsight Systems (``nsys profile``) where the image has ``nsys``; its report goes to
    ``<profile_dir>/nsys/``. Where ``nsys`` is missing the rank says so in one log line and runs without it.
    Default: none."""
    after: str | None = None
    """Id of a job this one must follow, normally its preflight (``moe-cdk verify render``): the job
    starts only once that one completed with exit 0 (``--dependency=afterok:ID``), and Slurm cancels it
    when that one failed (``--kill-on-invalid-dep=yes``) instead of leaving it pending forever."""

    def problems(self) -> list[Problem]:
        """Every problem with this spec, keyed by field."""
        found: list[Problem] = []

        def add(name: str, what: str, got: object, allowed: str) -> None:
            found.append(problem(what, got=got, allowed=allowed).at(name))

        if not _JOB_NAME.match(self.job_name):
            add("job_name", "not a usable job name", self.job_name, "1 to 128 letters, digits, '.', '_' or '-'")
        if self.nodes < 1:
            add("nodes", "too few", self.nodes, "1 or more")
        if self.tasks_per_node < 1:
            add("tasks_per_node", "too few", self.tasks_per_node, "1 or more")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            add("gpus_per_node", "too few", self.gpus_per_node, "1 or more, or null for none")
        for name in ("partition", "qos", "account"):
            value = getattr(self, name)
            if value is not None and not _SLURM_NAME.match(value):
                add(name, "not a Slurm name", value, "letters, digits, '.', '_' or '-'")
        if self.constraint is not None and (not self.constraint.strip() or any(c.isspace() for c in self.constraint)):
            add("constraint", "not a feature expression", self.constraint, "features joined by & | , without spaces")
        if not (_TIME_LIMIT.match(self.time_limit) or self.time_limit.upper() in ("UNLIMITED", "INFINITE")):
            add("time_limit", "not a Slurm time", self.time_limit, _TIME_ALLOWED)
        if self.signal_lead_seconds <= 0:
            add("signal_lead_seconds", "not positive", self.signal_lead_seconds, "1 or more")
        else:
            limit = _time_limit_seconds(self.time_limit)
            if limit is not None and self.signal_lead_seconds >= limit:
                add(
                    "signal_lead_seconds",
                    "not shorter than time_limit",
                    self.signal_lead_seconds,
                    f"less than {limit} (time_limit {self.time_limit!r})",
                )
        if self.nice is not None and not -2147483645 <= self.nice <= 2147483645:
            add("nice", "out of range", self.nice, "-2147483645 to 2147483645")
        if (self.container_image is None) == (not self.local):
            add(
                "container_image",
                "set together with local" if self.local else "missing for a job that is not local",
                self.container_image,
                "an image when local is false, null when local is true",
            )
        if self.container_image is not None and not self.container_image.strip():
            add("container_image", "empty", self.container_image, "an image URI or a squashfs path")
        if self.container_mounts is not None and self.container_image is None:
            add(
                "container_mounts",
                "set without container_image",
                self.container_mounts,
                "null unless container_image is set",
            )
        if (self.train_config is None) == (self.train_profile is None):
            what = "given with train_profile" if self.train_config is not None else "neither it nor train_profile given"
            add("train_config", what, self.train_config, "exactly one of train_config and train_profile")
        elif self.train_config is not None and not self.train_config:
            add("train_config", "empty", self.train_config, "a path to a YAML file on the nodes")
        if not self.profile_dir:
            add("profile_dir", "empty", self.profile_dir, "a folder every node sees")
        if self.local and not self.python:
            add("python", "empty", self.python, "an interpreter such as python3")
        if not 1 <= self.master_port <= 65535:
            add("master_port", "out of range", self.master_port, "1 to 65535")
        if not self.output or any(c.isspace() for c in self.output):
            # sbatch splits #SBATCH lines on white space, without shell quoting.
            add("output", "empty or with white space", self.output, "a file name pattern such as %x-%j.out")
        if self.max_requeues < 0:
            add("max_requeues", "negative", self.max_requeues, "0 or more")
        ranks = self.nodes * self.tasks_per_node
        if self.nsys_rank is not None and not 0 <= self.nsys_rank < ranks:
            add("nsys_rank", "no such rank in this job", self.nsys_rank, f"0 to {ranks - 1}, or null for none")
        if self.after is not None and not self.after.isdigit():
            add("after", "not a Slurm job id", self.after, "the job id sbatch --parsable printed, e.g. 1234")
        return found

    def validate(self) -> None:
        """Raise ``ConfigError`` listing every problem, or do nothing."""
        raise_if_any(self.problems(), subject="Slurm job spec")


def _time_limit_seconds(value: str) -> int | None:
    """``--time`` in seconds, or None for an unlimited or unreadable limit."""
    if not _TIME_LIMIT.match(value):
        return None
    days = 0
    if "-" in value:
        day_part, value = value.split("-", 1)
        days = int(day_part)
        parts = [int(p) for p in value.split(":")] + [0] * (3 - len(value.split(":")))
        hours, minutes, seconds = parts
    else:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def enroot_image(image: str) -> str:
    """``image`` in the form pyxis' ``--container-image`` takes: ``[USER@][REGISTRY#]IMAGE[:TAG]|PATH``.

    pyxis (github.com/NVIDIA/pyxis, README "Usage") separates the registry from the image
    with ``#``, so ``123.dkr.ecr.us-east-2.amazonaws.com/moe:latest`` becomes
    ``123.dkr.ecr.us-east-2.amazonaws.com#moe:latest``. Paths (squashfs files) and
    references that already have a ``#`` or no registry are returned unchanged.
    """
    if "#" in image or image.startswith(("/", ".")) or "/" not in image:
        return image
    registry, rest = image.split("/", 1)
    user = ""
    if "@" in registry:
        user, registry = registry.rsplit("@", 1)
        user += "@"
    return f"{user}{registry}#{rest}" if _REGISTRY.match(registry) else image


def ecr_registry(image: str) -> tuple[str, str] | None:
    """``(registry, region)`` when ``image`` is in a private Amazon ECR registry, else None."""
    registry = image.split("/", 1)[0].rsplit("@", 1)[-1] if "/" in image else ""
    match = _ECR_REGISTRY.match(registry)
    return (registry, match.group(1)) if match else None


def _sbatch_lines(spec: SlurmJobSpec) -> list[str]:
    lines = [f"--job-name={spec.job_name}", f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.tasks_per_node}"]
    if spec.gpus_per_node is not None and not spec.local:
        lines.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.partition is not None:
        lines.append(f"--partition={spec.partition}")
    if spec.constraint is not None:
        lines.append(f"--constraint={spec.constraint}")
    if spec.exclusive:
        lines.append("--exclusive")
    lines.append("--requeue" if spec.requeue else "--no-requeue")
    lines.append(f"--signal=B:USR1@{spec.signal_lead_seconds}")
    lines.append(f"--time={spec.time_limit}")
    if spec.account is not None:
        lines.append(f"--account={spec.account}")
    if spec.qos is not None:
        lines.append(f"--qos={spec.qos}")
    if spec.nice is not None:
        lines.append(f"--nice={spec.nice}")
    lines.append(f"--output={spec.output}")
    lines.append("--open-mode=append")
    if spec.after is not None:
        lines += [f"--dependency=afterok:{spec.after}", "--kill-on-invalid-dep=yes"]
    return [f"#SBATCH {line}" for line in lines]


def _command(spec: SlurmJobSpec) -> str:
    """The srun command line, one option per continued line."""
    srun = ["srun", *([] if spec.local else ['"${auto_resume[@]}"']), "--kill-on-bad-exit=1"]
    if spec.container_image is not None:
        srun.append(f"--container-image={shlex.quote(enroot_image(spec.container_image))}")
        if spec.container_mounts is not None:
            srun.append(f"--container-mounts={shlex.quote(spec.container_mounts)}")
    trainer = [shlex.quote(spec.python), "-m", "moe_cdk.cli.train"] if spec.local else ["moe-train"]
    if spec.nsys_rank is not None:
        trainer = ['bash -c "$nsys_wrapper"', "nsys-wrapper", *trainer]
    args = ["--config", trainer_config_arg(spec)]
    args += [shlex.quote(arg) for arg in spec.train_args]
    # Keep an option and its value on one line: "--set key=value", "--max-steps 40".
    pairs: list[str] = []
    for arg in args:
        if pairs and pairs[-1].startswith("-") and " " not in pairs[-1] and not arg.startswith("-"):
            pairs[-1] += f" {arg}"
        else:
            pairs.append(arg)
    words = [*srun, " ".join(trainer), *pairs]
    return " \\\n    ".join(words) + " &"


_PREAMBLE = """\
set -euo pipefail

log() { printf '%s slurm_job[%s]: %s\\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "${SLURM_JOB_ID:-?}" "$*" >&2; }

restart_count="${SLURM_RESTART_COUNT:-0}"
log "job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: SLURM_RESTART_COUNT=${restart_count}"

# The ranks meet on the first node of the allocation. Its NodeAddr, not its name: the name
# need not resolve (several virtual nodes on one host share one address).
first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')"
MASTER_ADDR="$(scontrol show node "$first_node" -o | tr ' ' '\\n' | awk -F= '$1 == "NodeAddr" {print $2}')"
export MASTER_ADDR="${MASTER_ADDR:-$first_node}"
export MASTER_PORT=__MASTER_PORT__
log "rendezvous ${MASTER_ADDR}:${MASTER_PORT} (${first_node})"
"""

_EFA = """\
# EFA and NCCL settings written by the node lifecycle scripts, when present.
efa_env_file=__EFA_ENV_FILE__
if [[ -r "$efa_env_file" ]]; then
    set +u
    # shellcheck source=/dev/null
    source "$efa_env_file"
    set -u
    log "sourced ${efa_env_file}"
fi
"""

# The credentials line follows the ECR example of enroot's doc/cmd/import.md. enroot hands the part
# of the line after "password" to sh (`echo ...`, src/common.sh common::evalnetrc) as the user who
# pulls, so the `||` runs there.
_ENROOT_CREDENTIALS = """\
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
    printf 'machine %s login AWS password $(%s %s 2>/dev/null || %s %s)\\n' \\
        "$registry" "$helper" "$region" "$cli" "$region" >>"$tmp"
    chmod 600 "$tmp"
    mv -f "$tmp" "${dir}/.credentials"
}
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --kill-on-bad-exit=1 \\
    bash -c "$(declare -f write_enroot_credentials); write_enroot_credentials __REGISTRY__ __REGION__"
log "enroot credentials for __REGISTRY__ written on every node"
"""

_AUTO_RESUME = """\
# HyperPod auto-resume (SageMaker Developer Guide, "Automatic node recovery and auto-resume"):
# when a node fails, HyperPod replaces it and runs this srun step again, and the trainer
# resumes from its last checkpoint. Elsewhere the requeue below is the only retry.
auto_resume=()
if [[ -d __MARKER__ ]]; then
    auto_resume=(--auto-resume=1)
    log "HyperPod node: the training step runs with srun --auto-resume=1"
fi
"""

_USR1_NOTE = """\
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
"""

_SIGNALS = """\
# USR1 and TERM reach this shell; the traps pass them on to the job step.
srun_pid=""
# shellcheck disable=SC2317  # only the traps below call it
forward_signal() {
    log "got $1: __ASK__"
    if [[ -n "$srun_pid" ]]; then
        kill -__STEP_SIGNAL__ "$srun_pid" 2>/dev/null || true
    fi
}
trap 'forward_signal USR1' USR1
trap 'forward_signal TERM' TERM

# srun reports each task that fails on the job's stderr; what it reports from here on is this run's.
job_stderr="$( (scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null || true) | tr ' ' '\\n' \\
    | awk -F= '$1 == "StdErr" {print $2}')"
job_stderr_offset="$(stat -c %s "$job_stderr" 2>/dev/null || echo 0)"
"""

_WAIT_AND_EXIT = """srun_pid=$!

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

max_requeues=__MAX_REQUEUES__
# shellcheck disable=SC2317  # called below
permanent() { local rc="$1"; (( __PERMANENT__ )); }
# srun exits with the highest of its tasks' codes. Once a task exits non-zero, --kill-on-bad-exit TERMs the
# others, and their 143 would hide a task's permanent exit (ranks finish their checks seconds apart): the
# code srun reported for a task ("srun: error: NODE: task N: Exited with exit code C") decides then.
if (( rc != 0 )) && ! permanent "$rc" && [[ -r "$job_stderr" ]]; then
    reported='s/^srun: error: .*: tasks\\{0,1\\} [0-9,-]*: Exited with exit code \\([0-9]*\\)$/\\1/p'
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
job_state="$(tr ' ' '\n' <<<"$job_fields" | awk -F= '$1 == "JobState" {print $2}')"
slurm_restarts="$(tr ' ' '\n' <<<"$job_fields" | awk -F= '$1 == "Restarts" {print $2}')"
if [[ -n "$job_state" && "$job_state" != RUNNING ]]; then
    if (( ${slurm_restarts:-0} > restart_count )); then
        log "Slurm is requeueing the job itself (restart ${slurm_restarts}); the next run resumes from its checkpoint"
        exit 0
    fi
    log "Slurm is ending the job (JobState ${job_state}: scancel, or its time limit): not requeueing;" \\
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
"""


_PROFILE = """\
# The training profile this job runs, written where every node, and the container, sees it: beside
# the run's checkpoints. A requeued job writes the same text again, through a file of an unpredictable
# name (mktemp: never through a link planted at a name known in advance), renamed into place.
mkdir -p __DIR__
train_config=__DIR__/"train-${SLURM_JOB_ID}.yaml"
profile_tmp="$(mktemp "${train_config}.XXXXXX")"
cat >"$profile_tmp" <<'__EOF__'
__TEXT____EOF__
mv -f "$profile_tmp" "$train_config"
log "training profile: ${train_config}"
"""


_NSYS = """\
# The rank that runs under Nsight Systems, as AWS's Nsight samples wrap a rank's command
# (aws-samples/awsome-distributed-training@1c5b64b8, 4.validation_and_observability/5.nsight/
# slurm-workshop-artifacts/nccl-slurm-exec-delay-duration.sh). nsys is looked for where the rank
# runs (in the container); without it the rank runs as it would have.
# shellcheck disable=SC2016  # the rank's bash -c expands it, not this shell
nsys_wrapper=__WRAPPER__
"""


def nsys_wrapper(rank_test: str, rank: int, report: str) -> str:
    """A bash script that runs its arguments, under ``nsys profile`` when ``rank_test`` (a bash test) holds and
    ``nsys`` is on the PATH, writing ``report`` (a bash word: a path, quoted, and variables); without nsys one log
    line says so."""
    return f"""\
if {rank_test}; then
    report={report}
    if command -v nsys >/dev/null 2>&1; then
        mkdir -p "$(dirname "$report")"
        printf '%s nsys: rank %s runs under Nsight Systems; report %s.nsys-rep\\n' \\
            "$(date -u +%FT%TZ)" {rank} "$report" >&2
        exec nsys profile --trace=cuda,nvtx,osrt --force-overwrite=true --output="$report" "$@"
    fi
    printf '%s nsys: not found in the image; rank %s runs without Nsight Systems\\n' "$(date -u +%FT%TZ)" {rank} >&2
fi
exec "$@"
"""


def _nsys(spec: SlurmJobSpec) -> str:
    rank = spec.nsys_rank
    report = shlex.quote(f"{spec.profile_dir}/nsys/rank-{rank}-job-") + '"${SLURM_JOB_ID:-0}"'
    script = nsys_wrapper(f'[[ "${{SLURM_PROCID:-}}" == {rank} ]]', rank, report)
    return _NSYS.replace("__WRAPPER__", shlex.quote(script))


def trainer_config_arg(spec: SlurmJobSpec) -> str:
    """The trainer's ``--config`` value as the script's shell sees it."""
    return '"$train_config"' if spec.train_profile is not None else shlex.quote(spec.train_config)


def _write_profile(spec: SlurmJobSpec) -> str:
    text = spec.train_profile if spec.train_profile.endswith("\n") else spec.train_profile + "\n"
    delimiter = "MOE_CDK_PROFILE"
    while delimiter in text.splitlines():
        delimiter += "_"
    return (
        _PROFILE.replace("__DIR__", shlex.quote(spec.profile_dir))
        .replace("__EOF__", delimiter)
        .replace("__TEXT__", text)
    )


def batch_header(spec: SlurmJobSpec, title: str) -> list[str]:
    """The start of a batch script for ``spec``'s nodes: ``title`` (comment lines), the ``#SBATCH``
    lines, the rendezvous, for a container job the EFA environment and the ECR credentials, and the
    training profile the job carries."""
    parts = [
        "#!/bin/bash",
        title,
        *_sbatch_lines(spec),
        "",
        _PREAMBLE.replace("__MASTER_PORT__", str(spec.master_port)),
    ]
    if not spec.local:
        if spec.efa_env_file:
            parts.append(_EFA.replace("__EFA_ENV_FILE__", shlex.quote(spec.efa_env_file)))
        if (ecr := ecr_registry(spec.container_image)) is not None:
            parts.append(_ENROOT_CREDENTIALS.replace("__REGISTRY__", ecr[0]).replace("__REGION__", ecr[1]))
    if spec.train_profile is not None:
        parts.append(_write_profile(spec))
    return parts


def signal_forwarding(
    *, step_signal: str = "USR1", ask: str = "asking the trainer to save a checkpoint and stop"
) -> str:
    """The traps that pass USR1 and TERM on to the job step as ``step_signal``, and where the job's stderr stands
    before that step starts (what :func:`wait_and_requeue` reads srun's task reports from)."""
    return _SIGNALS.replace("__STEP_SIGNAL__", step_signal).replace("__ASK__", ask)


def wait_and_requeue(*, max_requeues: int, permanent: str = "rc < 128") -> str:
    """The wait for the step, and the requeue after a retryable exit; ``permanent`` is the bash arithmetic test
    on ``rc`` of the exits that end the job instead."""
    return _WAIT_AND_EXIT.replace("__MAX_REQUEUES__", str(max_requeues)).replace("__PERMANENT__", permanent)


def auto_resume(marker: str = HYPERPOD_MARKER) -> str:
    """The ``auto_resume`` array: ``--auto-resume=1`` for the training step on a HyperPod node."""
    return _AUTO_RESUME.replace("__MARKER__", shlex.quote(marker))


def render_sbatch(spec: SlurmJobSpec) -> str:
    """The batch script for ``spec``; raises ``ValueError`` listing every problem with the spec."""
    spec.validate()
    kind = "local (CPU, gloo)" if spec.local else f"container {spec.container_image}"
    parts = batch_header(
        spec,
        f"# moe-cdk training job {spec.job_name}: {spec.nodes} node(s) x {spec.tasks_per_node} task(s), {kind}.\n"
        "# Rendered by moe_cdk.jobs.slurm_job.render_sbatch; submit with sbatch.",
    )
    if not spec.local:
        parts.append(auto_resume(spec.hyperpod_marker))
    # A job that Slurm may not requeue (requeue=False) stops at its first retryable exit.
    max_requeues = spec.max_requeues if spec.requeue else 0
    if spec.nsys_rank is not None:
        parts.append(_nsys(spec))
    parts.append(_USR1_NOTE + signal_forwarding() + _command(spec) + "\n" + wait_and_requeue(max_requeues=max_requeues))
    return "\n".join(parts)


__all__ = [
    "HYPERPOD_MARKER",
    "SlurmJobSpec",
    "auto_resume",
    "batch_header",
    "ecr_registry",
    "enroot_image",
    "nsys_wrapper",
    "render_sbatch",
    "signal_forwarding",
    "trainer_config_arg",
    "wait_and_requeue",
]


def team_path(team: str, path: str) -> str:
    """``path`` under the team's folder when it is on the shared file system (/fsx/x becomes
    /fsx/teams/<team>/x); a path elsewhere, or already in the team's folder, as it is."""
    root = PurePosixPath(TEAMS_FOLDER).parent  # /fsx
    given, own = PurePosixPath(path), PurePosixPath(TEAMS_FOLDER) / team
    if not given.is_relative_to(root) or given.is_relative_to(own):
        return path
    return str(own / given.relative_to(root))


def job_spec_from_config(
    config: Config,
    *,
    profile: JobProfile | None = None,
    image: str | None = None,
    local: bool = False,
    python: str = "python3",
    group: str | None = None,
    nodes: int | None = None,
    time_limit: str = "48:00:00",
    signal_lead_seconds: int = 300,
    qos: str | None = None,
    team: str | None = None,
    nice: int | None = None,
    max_requeues: int = 10,
    job_name: str | None = None,
    train_args: tuple[str, ...] = (),
    after: str | None = None,
    master_port: int = 29500,
    nsys_rank: int | None = None,
) -> SlurmJobSpec:
    """The sbatch job for a compute group of ``config``: node count, GPUs, partition and
    constraint come from the configuration and the instance catalog, never typed again; the job
    carries ``profile`` (default: the configuration's ``training.profile``) and writes it beside the
    run's checkpoints. Raises ``ConfigError`` naming the option for an image given with ``local``
    (or neither)."""
    if local == bool(image):
        raise ConfigError(
            [
                problem(
                    "give an image, or --local for a CPU-only cluster, not both",
                    got=image,
                    allowed="--image URI, or --local",
                ).at("--image")
            ]
        )
    profile = profile or load_job_profile(config, None, train_args)
    account, qos = job_team(config.teams, team, qos)
    profile_dir = profile.config.checkpoint.dir
    if account is not None:
        # A team's run writes where only its team reads (the team's folder, slurm_teams.sh): the profile's
        # checkpoint folder and metrics file, where they are on the shared file system, move under it.
        checkpoint_dir = team_path(account, profile.config.checkpoint.dir)
        metrics_file = team_path(account, profile.config.metrics.file) if profile.config.metrics.file else None
        train_args = (
            *train_args,
            *(("--checkpoint-dir", checkpoint_dir) if checkpoint_dir != profile.config.checkpoint.dir else ()),
            *(("--metrics-file", metrics_file) if metrics_file and metrics_file != profile.config.metrics.file else ()),
        )
        profile_dir = checkpoint_dir
    chosen = config.cluster.compute_group(group)
    node_count = nodes_of(chosen, nodes)
    spec = catalog.lookup(chosen.instance_type)
    if not local and (refusal := moe_train_refusal(spec)):
        raise refusal
    gpus = spec.accelerator_count if spec.accelerator_kind is catalog.AcceleratorKind.NVIDIA_GPU else None
    return SlurmJobSpec(
        job_name=job_name or profile.name,
        nodes=node_count,
        tasks_per_node=1 if local else (spec.accelerator_count or 1),
        gpus_per_node=None if local else gpus,
        partition=chosen.to_props().partition_name,
        constraint="efa" if spec.supports_efa and config.cluster.require_efa else None,
        exclusive=not local,
        time_limit=time_limit,
        signal_lead_seconds=signal_lead_seconds,
        qos=qos,
        account=account,
        nice=nice,
        container_image=None if local else image,
        container_mounts=None if local else "/fsx:/fsx",
        train_profile=profile.text,
        profile_dir=profile_dir,
        train_args=train_args,
        local=local,
        python=python,
        max_requeues=max_requeues,
        after=after,
        master_port=master_port,
        nsys_rank=nsys_rank,
    )
