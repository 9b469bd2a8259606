"""node_launcher: one rank per device, torchrun's variables, and the trainer's exit codes kept."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

from survivors import alive, descendants

from moe_cdk.training.exit_codes import EXIT_FAILED_RETRYABLE, KUBEFLOW_RETRYABLE
from moe_cdk.training.launch_env import LaunchEnv
from moe_cdk.training.node_launcher import run_node

NODE = LaunchEnv(
    launcher="kubeflow",
    rank=4,
    world_size=8,
    local_rank=0,
    local_world_size=2,
    node_rank=2,
    num_nodes=4,
    master_addr="10.0.0.1",
    master_port=23456,
)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_each_rank_gets_torchrun_variables(tmp_path):
    code = f"""
        import json, os
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
        open(os.path.join({str(tmp_path)!r}, os.environ["LOCAL_RANK"]), "w").write(json.dumps({{k: os.environ[k] for k in keys}}))
    """  # noqa: E501
    assert run_node(NODE, python(code)) == 0
    seen = [json.loads((tmp_path / str(i)).read_text()) for i in range(2)]
    assert seen == [
        {
            "RANK": str(4 + i),
            "WORLD_SIZE": "8",
            "LOCAL_RANK": str(i),
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "2",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "23456",
        }
        for i in range(2)
    ]


def test_a_failing_rank_s_exit_code_is_kept():
    code = "import os, sys; sys.exit(138 if os.environ['LOCAL_RANK'] == '1' else 0)"
    assert run_node(NODE, python(code)) == 138


def test_a_permanent_failure_stays_permanent():
    assert run_node(NODE, python("import sys; sys.exit(2)")) == 2


def test_a_rank_killed_by_a_signal_counts_as_128_plus_the_signal():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL) if os.environ['LOCAL_RANK'] == '0' else None"
    assert run_node(NODE, python(code)) == 128 + signal.SIGKILL


def test_a_rank_that_aborts_is_retryable_under_kubeflow():
    # SIGABRT would be 134, which Kubeflow's ExitCode policy treats as permanent.
    code = "import os, signal; os.kill(os.getpid(), signal.SIGABRT) if os.environ['LOCAL_RANK'] == '0' else None"
    code_seen = run_node(NODE, python(code))
    assert code_seen == EXIT_FAILED_RETRYABLE and code_seen in KUBEFLOW_RETRYABLE


def test_ranks_left_running_after_a_failure_are_stopped():
    code = "import os, sys, time; sys.exit(3) if os.environ['LOCAL_RANK'] == '0' else time.sleep(600)"
    started = time.monotonic()
    assert run_node(NODE, python(code), grace_s=1.0) == 3
    assert time.monotonic() - started < 30


def test_sigterm_reaches_every_rank_and_their_exit_code_is_returned(tmp_path):
    rank = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        time.sleep(600)
    """  # noqa: E501
    launcher = f"""
        import sys
        from moe_cdk.training.launch_env import LaunchEnv
        from moe_cdk.training.node_launcher import run_node
        node = LaunchEnv(launcher="kubeflow", rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0,
                         num_nodes=1, master_addr="127.0.0.1", master_port=23456)
        print("started", flush=True)
        sys.exit(run_node(node, {python(rank)!r}))
    """
    process = subprocess.Popen(python(launcher), stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "started"
    time.sleep(2)  # let the ranks install their handlers
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143


def test_ranks_are_terminated_when_the_launcher_is_killed(tmp_path):
    rank = f"""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (open({str(tmp_path)!r} + f"/term-{{os.getpid()}}", "w").close(), sys.exit(143)))
        time.sleep(600)
    """  # noqa: E501
    launcher = f"""
        import sys
        from moe_cdk.training.launch_env import LaunchEnv
        from moe_cdk.training.node_launcher import run_node
        node = LaunchEnv(launcher="kubeflow", rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0,
                         num_nodes=1, master_addr="127.0.0.1", master_port=23456)
        sys.exit(run_node(node, {python(rank)!r}))
    """
    process = subprocess.Popen(python(launcher))
    deadline = time.monotonic() + 30
    while len(ranks := descendants(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2)  # let the ranks install their handlers
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while alive(ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(ranks) == 2 and not alive(ranks)
    assert len(list(tmp_path.glob("term-*"))) == 2  # each got TERM, the signal it saves a checkpoint on
