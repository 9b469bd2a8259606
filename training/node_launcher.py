"""Start one trainer process per device on this node and exit with the trainer's own code.

SageMaker Training Jobs and Kubeflow PyTorchJob (with ``nprocPerNode``) start one process
per node. That process becomes this launcher: it starts ``local_world_size`` ranks of
``python -m moe_cdk.cli.train`` with torchrun's variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ...), so each rank sees an ordinary torchrun launch.

Unlike torchrun, which exits 1 whenever a rank fails, the launcher keeps the trainer's exit
code convention, which the orchestrators act on (Kubeflow's ``restartPolicy: ExitCode``,
``moe-cdk sagemaker submit --chain``): 0 when every rank succeeds, otherwise the code of the
first rank that failed (see ``exit_code`` for a rank killed by a signal). SIGTERM and SIGUSR1 are
forwarded to every rank, which checkpoint and exit 143. Once a rank has failed, the others
get ``grace_s`` seconds to notice, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from moe_cdk.training.exit_codes import EXIT_FAILED_RETRYABLE, KUBEFLOW_RETRYABLE
from moe_cdk.training.launch_env import LaunchEnv
from moe_cdk.training.stop import die_with_parent

log = logging.getLogger(__name__)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def exit_code(returncode: int) -> int:
    """A rank's ``Popen.returncode`` as this node's exit code. A rank killed by INT, KILL or
    TERM reports 128+N as a shell would; one killed by any other signal (SIGABRT from a NCCL
    watchdog after a lost peer, SIGSEGV or SIGBUS in a library) reports
    ``EXIT_FAILED_RETRYABLE``, because Kubeflow treats 134 or 139 as permanent and such a
    crash is what a restart from the last checkpoint is for."""
    if returncode >= 0:
        return returncode
    code = 128 - returncode
    return code if code in KUBEFLOW_RETRYABLE else EXIT_FAILED_RETRYABLE


def rank_environ(env: LaunchEnv, local_rank: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of local rank ``local_rank``: torchrun's variables for this node's place.
    ``env`` stands for local rank 0 of the node, so the rank's place is an offset from it."""
    rank = dataclasses.replace(env, rank=env.rank + local_rank, local_rank=local_rank)
    return {**(os.environ if base is None else base), **rank.torch_env(), "GROUP_RANK": str(env.node_rank)}


def run_node(env: LaunchEnv, command: Sequence[str], *, grace_s: float = 60.0, poll_s: float = 0.2) -> int:
    """Run ``command`` once per local rank; return 0 or the first failing rank's exit code."""
    # A rank outlives a launcher that was SIGKILLed (the pod's last resort) only as an orphan
    # nobody waits for: TERM it then, so it saves a checkpoint and stops.
    with_parent = functools.partial(die_with_parent, os.getpid(), signal.SIGTERM)
    children = [
        subprocess.Popen(list(command), env=rank_environ(env, local_rank), preexec_fn=with_parent)
        for local_rank in range(env.local_world_size)
    ]
    previous = {}

    def forward(signum, frame):
        log.info("node launcher: forwarding %s to %d rank(s)", signal.Signals(signum).name, len(children))
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in FORWARDED_SIGNALS:
        previous[signum] = signal.signal(signum, forward)
    # A terminal's Ctrl-C reaches the ranks themselves (one foreground process group): they save
    # and exit 130, which this launcher then reports.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    first_failure: int | None = None
    failed_at = None
    terminated = False
    try:
        while any(child.poll() is None for child in children):
            if first_failure is None:
                for local_rank, child in enumerate(children):
                    if child.returncode not in (None, 0):
                        first_failure = exit_code(child.returncode)
                        failed_at = time.monotonic()
                        log.error(
                            "node launcher: local rank %d exited %d; stopping the others", local_rank, first_failure
                        )
                        break
            elif not terminated and time.monotonic() - failed_at > grace_s:
                for child in children:
                    if child.poll() is None:
                        child.terminate()
                terminated = True
            elif terminated and time.monotonic() - failed_at > 2 * grace_s:
                for child in children:
                    if child.poll() is None:
                        child.kill()
            time.sleep(poll_s)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if first_failure is None:
        first_failure = next((exit_code(c.returncode) for c in children if c.returncode != 0), 0)
    return first_failure


def trainer_command(argv: Sequence[str]) -> list[str]:
    """One rank of the trainer, with the same arguments this launcher got."""
    return [sys.executable, "-m", "moe_cdk.cli.train", *argv]
