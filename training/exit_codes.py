"""The trainer's exit codes, which the orchestrators act on (Kubeflow's ``restartPolicy:
ExitCode``, the sbatch script's requeue, ``moe-cdk sagemaker submit --chain``): 1 to 127 are
permanent, 128 to 255 retryable. Standard library only, so a launcher process can use them
without importing torch."""

EXIT_OK = 0
EXIT_CONFIG = 2
"""Bad configuration or input: permanent, never retried."""
EXIT_PREEMPTED = 143
"""Stopped by SIGTERM or SIGUSR1 after saving a checkpoint (128 + SIGTERM): retryable."""
EXIT_FAILED_RETRYABLE = 134
"""An unexpected failure (a lost peer, a device error): retryable, resumes from the last checkpoint."""
