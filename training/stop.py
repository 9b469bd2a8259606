"""A request to stop: SIGTERM and SIGUSR1 set a flag instead of ending the process.

Installed first thing in a rank (``train_cli.main``), before torch is imported: Slurm's
``srun --kill-on-bad-exit`` and the node launcher TERM the other ranks as soon as one exits,
and a rank that died of that TERM while still starting up would report 143 (retryable) for
what was another rank's permanent exit 2. With the flag, a starting rank goes on to the same
error and exits with the same code; a training rank saves at the next step boundary and exits
143. Standard library only.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested:
    """Set by SIGTERM/SIGUSR1; the training loop saves at the next step boundary and exits retryably."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def ignore_from_now(self) -> None:
        """The rank's exit code is decided: a TERM during interpreter shutdown (which resets
        Python-level handlers to the default action) must not turn it into 143."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def agreed(self, device) -> bool:
        """True on every rank when any rank was signalled (a collective: every rank calls it)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.signal is not None else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
