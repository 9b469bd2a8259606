"""A request to stop: SIGTERM, SIGUSR1 and SIGINT set a flag instead of ending the process.

Installed in a rank (``cli/train.py``) before torch is imported, and set to ignore them
once the rank's exit code is decided (``ignore_from_now``). Slurm's ``srun
--kill-on-bad-exit`` and the node launcher TERM the other ranks as soon as one exits. A rank
that got that TERM while still starting up, or while its interpreter shut down after its own
exit 2 (Python resets its handlers to the default action then), died of it, and srun
reported 143, retryable, for a permanent configuration error: the job was requeued (seen on
the real Slurm of tests/test_slurm.py). With the flag the rank finishes with its own code; a
training rank saves at the next step boundary and exits 143. Standard library only.

``die_with_parent`` is for the processes a rank or launcher starts (the checkpoint writer's
manager, the node launcher's ranks): they get a signal when their parent dies, even by
SIGKILL, instead of living on as orphans.
"""

from __future__ import annotations

import ctypes
import os
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""What launchers send to stop a job: Slurm (scancel, preemption, ``--signal``), the kubelet,
the node launcher."""
HANDLED_SIGNALS = (*STOP_SIGNALS, signal.SIGINT)
"""The stop signals and a terminal's Ctrl-C, which a rank handles alike: save, then exit."""


class StopRequested:
    """Set by SIGTERM, SIGUSR1 or SIGINT; the training loop saves at the next step boundary and exits retryably
    (``exit_code_for``). Repeated signals change nothing: the save they ask for is under way."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.announce = False
        """Print one line when Ctrl-C arrives (set on rank 0 once the rank is known)."""
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:
            return
        self.signal = signum
        if signum == signal.SIGINT and self.announce:
            # os.write, not logging: a handler may run while the logging lock is held.
            os.write(2, b"interrupted: saving a checkpoint at the end of this step, then stopping\n")

    def ignore_from_now(self) -> None:
        """The rank's exit code is decided: a TERM during interpreter shutdown (which resets
        Python-level handlers to the default action) must not turn it into 143."""
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def agreed(self, device) -> int | None:
        """The stop signal when any rank was signalled, on every rank alike (a collective: every
        rank calls it): TERM over USR1 over INT, the larger number. None when no rank was."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([float(self.signal or 0)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None


def exit_code_for(signum: int) -> int:
    """128 + SIGINT after a Ctrl-C, as a shell reports it; 143 (128 + SIGTERM) for TERM and USR1,
    since 138 (128 + USR1) means an unexpected failure (exit_codes.py). Both are retryable."""
    from moe_cdk.training.exit_codes import EXIT_INTERRUPTED, EXIT_PREEMPTED

    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (prctl
    PR_SET_PDEATHSIG), then exit at once if the parent ``parent_pid`` is already gone (it
    died before the request could be made). Run it first thing in a helper process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)


def helper_process_init(parent_pid: int) -> None:
    """The initializer of a rank's helper process (the checkpoint writer's manager): it ignores
    the signals the rank acts on, which Slurm, a terminal's Ctrl-C and ``kill -- -PGID`` send to
    every process of the group, so that it lives to serve the save they ask for; and it dies
    with the rank (standard library only: a spawned process imports this module alone)."""
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(parent_pid)
