"""``moe-preflight``: the checks the preflight job (``moe-cdk verify render``) runs on the nodes, in the
training image or, for a CPU cluster, with the host's Python.

    moe-preflight node --instance-type ml.p5en.48xlarge [--dcgm-level 1 --dcgm-json FILE]
    moe-preflight nccl-tests --log all_reduce_perf.log --instance-type ml.p5en.48xlarge --nodes 2
    moe-preflight nccom-test --log nccom_all_reduce.log --instance-type ml.trn2.48xlarge --nodes 2   # Trainium
    moe-preflight collectives --config PROFILE --instance-type ml.p5en.48xlarge   # every rank

Each prints verdict lines (training/fabric/preflight.py) and exits 0 when every check passed, 1 when one
failed, 2 when the command line or the profile is invalid.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError, problem

EXIT_FAILED = 1


def _print(verdicts) -> int:
    for verdict in verdicts:
        print(verdict.line(), flush=True)
    return 0 if all(v.passed for v in verdicts) else EXIT_FAILED


def _node(args: argparse.Namespace) -> int:
    from moe_cdk.training.fabric.preflight import check_node

    if not args.local and args.instance_type is None:
        return report(
            "moe-preflight node",
            ConfigError([problem("missing", got=None, allowed="an instance type, or --local").at("--instance-type")]),
        )
    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    dcgm_json = Path(args.dcgm_json) if args.dcgm_json else None
    return _print(
        [
            check_node(
                node,
                instance_type=args.instance_type,
                local=args.local,
                dcgm_level=args.dcgm_level,
                dcgm_json=dcgm_json,
            )
        ]
    )


def _nccl_tests(args: argparse.Namespace) -> int:
    from moe_cdk.training.fabric.preflight import check_nccl_tests

    log = Path(args.log)
    if not log.is_file():
        return report(
            "moe-preflight nccl-tests",
            ConfigError([problem("no such file", got=args.log, allowed="an nccl-tests log").at("--log")]),
        )
    return _print(
        [
            check_nccl_tests(
                log.read_text(errors="replace"),
                collective=args.collective or log.stem,
                instance_type=args.instance_type,
                nodes=args.nodes,
                local=args.local,
            )
        ]
    )


def _nccom_test(args: argparse.Namespace) -> int:
    from moe_cdk.training.fabric.preflight import check_nccom_test

    log = Path(args.log)
    if not log.is_file():
        return report(
            "moe-preflight nccom-test",
            ConfigError([problem("no such file", got=args.log, allowed="an nccom-test log").at("--log")]),
        )
    operation = args.operation or log.stem.removeprefix("nccom_")
    return _print(
        [
            check_nccom_test(
                log.read_text(errors="replace"),
                operation=operation,
                instance_type=args.instance_type,
                nodes=args.nodes,
            )
        ]
    )


def _collectives(args: argparse.Namespace) -> int:
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.launch_env import detect

    try:
        config = load_train_config(args.config)
        env = detect()
    except ConfigError as error:
        return report(args.config, error)
    # NCCL writes its INFO lines to a file of this process (%h host, %p pid: NCCL's NCCL_DEBUG_FILE), read
    # back after the first collective to see which network it chose. Set before torch initialises NCCL.
    if not args.local:
        log_dir = Path(tempfile.mkdtemp(prefix="moe-preflight-nccl-"))
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
        os.environ["NCCL_DEBUG_FILE"] = str(log_dir / "nccl.%h.%p.log")

    import torch
    import torch.distributed as dist

    from moe_cdk.training.fabric.bench import all_reduce, all_to_all, dispatch_shape
    from moe_cdk.training.fabric.preflight import Verdict, check_collective, check_nccl_network

    os.environ.update(env.torch_env())
    if args.local:
        device, dtype, backend = torch.device("cpu"), torch.bfloat16, "gloo"
    else:
        device, dtype, backend = torch.device("cuda", env.local_rank), torch.bfloat16, "nccl"
        torch.cuda.set_device(device)
    # A rank that never joins, or a transport that hangs, ends the collective with an error after
    # --timeout-s instead of holding the allocation until the job's time limit.
    timeout = datetime.timedelta(seconds=args.timeout_s)
    dist.init_process_group(backend, store=env.solo_store(), rank=env.rank, world_size=env.world_size, timeout=timeout)
    try:
        shape = dispatch_shape(config, world_size=env.world_size)
        try:
            exchanged = all_to_all(shape, device=device, dtype=dtype, iterations=args.iterations)
            reduced = all_reduce(args.all_reduce_bytes, device=device, dtype=dtype, iterations=args.iterations)
        except RuntimeError as error:  # torch's DistBackendError and timeouts among them
            failed = problem("the collective failed", got=str(error).splitlines()[0], allowed="correct data in time")
            return _print([Verdict(subject=f"{socket.gethostname()} collectives", problems=(failed,))])
        verdicts = []
        if not args.local and env.local_rank == 0:
            # One line per node: what its NCCL chose.
            logs = sorted(log_dir.glob(f"nccl.*.{os.getpid()}.log"))
            text = logs[0].read_text(errors="replace") if logs else ""
            verdicts.append(check_nccl_network(f"{socket.gethostname()} nccl", text, instance_type=args.instance_type))
        if env.rank == 0:
            verdicts += [check_collective(exchanged, shape=shape), check_collective(reduced)]
        code = _print(verdicts)
        # Every rank exits with the job's verdict, so srun and torchrun report it whichever rank failed.
        failed = torch.tensor([code], dtype=torch.int32, device=device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        return int(failed.item())
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-preflight", description="The preflight job's checks on the nodes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    node = commands.add_parser(
        "node", help="this node's GPUs (and DCGM result) or Neuron devices, and EFA devices, against the catalog"
    )
    node.add_argument("--instance-type", help="the node's instance type, e.g. ml.p5en.48xlarge")
    node.add_argument("--local", action="store_true", help="a CPU node: check the interpreter, torch and gloo only")
    node.add_argument("--node", help="the name in the verdict (default: SLURMD_NODENAME or the host name)")
    node.add_argument("--dcgm-level", type=int, choices=(0, 1, 2), default=0, help="DCGM level run (0: none)")
    node.add_argument("--dcgm-json", help="the output of dcgmi diag -r LEVEL -j, written on the host")
    node.set_defaults(run=_node)

    nccl = commands.add_parser("nccl-tests", help="an nccl-tests log (NCCL_DEBUG=INFO) against the catalog's floor")
    nccl.add_argument("--log", required=True, help="the output of all_reduce_perf or alltoall_perf")
    nccl.add_argument("--collective", help="the test's name (default: the log's file name without suffix)")
    nccl.add_argument("--instance-type", help="the nodes' instance type")
    nccl.add_argument("--nodes", type=int, default=1, help="nodes in the run (the floors apply from 2)")
    nccl.add_argument("--local", action="store_true", help="no catalog floor and no EFA check")
    nccl.set_defaults(run=_nccl_tests)

    nccom = commands.add_parser("nccom-test", help="a Neuron nccom-test log against the catalog's floor (Trainium)")
    nccom.add_argument("--log", required=True, help="the output of nccom-test")
    nccom.add_argument("--operation", help="all_reduce or alltoall (default: the log's name without nccom_)")
    nccom.add_argument("--instance-type", required=True, help="the nodes' instance type, e.g. ml.trn2.48xlarge")
    nccom.add_argument("--nodes", type=int, default=1, help="nodes in the run (the floor applies from 2)")
    nccom.set_defaults(run=_nccom_test)

    coll = commands.add_parser(
        "collectives", help="the EP all-to-all with the profile's dispatch shape, and an all-reduce"
    )
    coll.add_argument("--config", required=True, help="the training profile, as the nodes see it")
    coll.add_argument("--instance-type", help="the nodes' instance type (for the EFA check)")
    coll.add_argument("--local", action="store_true", help="CPU ranks over gloo")
    coll.add_argument("--all-reduce-bytes", type=int, default=256 * 2**20, help="all-reduce size (default 256 MiB)")
    coll.add_argument("--iterations", type=int, default=20, help="timed iterations (default 20)")
    coll.add_argument("--timeout-s", type=int, default=600, help="a collective's time limit (default 600 s)")
    coll.set_defaults(run=_collectives)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
