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

from moe_cdk.core.problems import EXIT_INVALID

EXIT_OK = 0
EXIT_CONFIG = EXIT_INVALID
"""Bad configuration or input: permanent, never retried."""
EXIT_PREEMPTED = 143
"""Stopped by SIGTERM or SIGUSR1 after saving a checkpoint (128 + SIGTERM): retryable."""
EXIT_FAILED_RETRYABLE = 138
"""An unexpected failure (a lost peer, a device error): retryable, resumes from the last
checkpoint. 138 is the code Kubeflow's operator reserves for a retryable user error."""
KUBEFLOW_RETRYABLE = frozenset({130, 137, 138, 143})
"""The exit codes Kubeflow's ``restartPolicy: ExitCode`` restarts; every other one is permanent."""
