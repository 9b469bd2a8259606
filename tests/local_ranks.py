"""Run a command as N ranks of this machine through moe-train's node launcher (a script of the tests, not a test
file): ``python tests/local_ranks.py N PORT COMMAND...``.

Each rank gets torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_PORT``...) from
``moe_cdk.training.node_launcher.run_node``, as under ``moe-train --nproc-per-node N``, and the script exits with the
first failing rank's code. It serves the probes, which are not moe-train: unlike torchrun's agent, which imports
torch and starts an elastic store before any rank starts (about 2 s of CPU here), it imports no torch."""

from __future__ import annotations

import sys

from moe_cdk.training.launch_env import LaunchEnv
from moe_cdk.training.node_launcher import run_node

if __name__ == "__main__":
    nproc, port, *command = sys.argv[1:]
    node = LaunchEnv(
        launcher="local",
        rank=0,
        world_size=int(nproc),
        local_rank=0,
        local_world_size=int(nproc),
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=int(port),
    )
    sys.exit(run_node(node, command))
