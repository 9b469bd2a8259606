"""The trainer's exit codes, which the orchestrators act on (Kubeflow's ``restartPolicy:
ExitCode``, the sbatch script's requeue, ``moe-cdk sagemaker submit --chain``). Standard
library only (and core), so a launcher process can use them without importing torch.

Kubeflow's training operator is the narrowest of the three: it restarts a pod only for
130, 137, 143 (killed by INT, KILL, TERM) and 138 (128 + SIGUSR1, "for user defined
retryable error"), and treats every other code as permanent
(kubeflow/training-operator, pkg/util/train/train_util.go, ``IsRetryableExitCode``). So
the trainer's retryable codes are from that set, and the Slurm script, which requeues
128 to 255, agrees with it.
"""

import errno
from pathlib import Path

from moe_cdk.core.problems import EXIT_INVALID

EXIT_OK = 0
EXIT_CONFIG = EXIT_INVALID
"""Bad configuration or input: permanent, never retried."""
EXIT_PREEMPTED = 143
"""Stopped by SIGTERM or SIGUSR1 after saving a checkpoint (128 + SIGTERM): retryable."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT) after saving a checkpoint (128 + SIGINT): retryable."""
EXIT_FAILED_RETRYABLE = 138
"""An unexpected failure (a lost peer, a device error): retryable, resumes from the last
checkpoint. 138 is the code Kubeflow's operator reserves for a retryable user error."""
KUBEFLOW_RETRYABLE = frozenset({130, 137, 138, 143})
"""The exit codes Kubeflow's ``restartPolicy: ExitCode`` restarts; every other one is permanent."""


PERMANENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS})
"""File-system errors that a person must clear (space, quota, a size limit, permissions, a read-only
mount): a restarted run would fail the same way."""


class SaveFailed(Exception):
    """A checkpoint save that failed on a file-system error. The step's folder is left without its
    marker, so no run resumes from it; the checkpoints completed before it are untouched.
    ``exit_code``: permanent (``EXIT_CONFIG``) when a rank's error is one of ``PERMANENT_ERRNOS``,
    else retryable. ``cause`` is None on a rank whose own writes succeeded: it prints nothing."""

    def __init__(self, step: int, path: Path, cause: OSError | None, kept: Path | None, *, permanent: bool) -> None:
        self.exit_code = EXIT_CONFIG if permanent else EXIT_FAILED_RETRYABLE
        self.cause = cause
        after = "no retry can help until that is fixed" if permanent else "a restarted run resumes from it"
        last = f"{kept.name}, the last complete checkpoint, is kept" if kept else "no earlier checkpoint was complete"
        what = f"{cause.strerror or cause} ({cause.filename or path})" if cause is not None else "on another rank"
        super().__init__(f"checkpoint.dir: saving step-{step} failed: {what}; {last}; {after}")
