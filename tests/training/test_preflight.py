"""The preflight's verdicts (training/fabric/preflight.py) on the node's tools' output and on nccl-tests logs, using the
real samples of tests/fixtures/fabric (SOURCES.md says where each came from), against the instance catalog."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from moe_cdk.core import catalog
from moe_cdk.training.config import load_train_config
from moe_cdk.training.fabric import logs as fabric_logs
from moe_cdk.training.fabric.bench import CollectiveResult, dispatch_shape
from moe_cdk.training.fabric.preflight import ToolOutput, Verdict, check_nccl_tests, check_node, run_tool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/fabric"
ROOT = Path(__file__).resolve().parents[2]


def sample(name: str) -> str:
    return (FIXTURES / name).read_text()


# nvidia-smi rows in NVIDIA_SMI_QUERY's CSV form. No real capture of this exact query could be cited
# (tests/fixtures/fabric/SOURCES.md), so these are written from the CSV format; the GPU names are the CUDA names.
def gpu_rows(count: int, name: str = "NVIDIA H100 80GB HBM3", ecc: str = "0") -> str:
    return "".join(f"{i}, {name}, GPU-{i:08d}-0000-0000-0000-000000000000, 81559, {ecc}\n" for i in range(count))


def runner(outputs: dict[str, ToolOutput]):
    def run(argv: Sequence[str]) -> ToolOutput:
        key = " ".join(argv[:2])
        return outputs.get(key, ToolOutput(argv=tuple(argv), returncode=127, stderr=f"{argv[0]}: command not found"))

    return run


def tool(argv: Sequence[str], stdout: str = "", returncode: int = 0, stderr: str = "") -> ToolOutput:
    return ToolOutput(argv=tuple(argv), returncode=returncode, stdout=stdout, stderr=stderr)


def p4de_node(**overrides) -> dict[str, ToolOutput]:
    outputs = {
        "nvidia-smi --query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total": tool(
            fabric_logs.NVIDIA_SMI_QUERY, gpu_rows(8, "NVIDIA A100-SXM4-80GB")
        ),
        "fi_info -p": tool(("fi_info", "-p", "efa"), sample("fi_info_p4d_efa_user_guide.txt")),
        "fi_info --version": tool(("fi_info", "--version"), sample("fi_info_version_amzn.txt")),
    }
    return outputs | overrides


def test_query_key_matches_the_command():
    assert " ".join(fabric_logs.NVIDIA_SMI_QUERY[:2]) in p4de_node()


def test_a_healthy_p4de_node_passes_with_what_was_measured():
    verdict = check_node("node1", instance_type="ml.p4de.24xlarge", run=runner(p4de_node()))
    assert verdict.line() == "preflight node1: PASS 8/8 A100 GPUs, 4/4 EFA devices, libfabric 1.19.0amzn3.0"


def test_a_node_without_efa_devices_fails_naming_the_count():
    outputs = p4de_node(**{"fi_info -p": tool(("fi_info", "-p", "efa"), sample("fi_info_no_efa_devices.txt"))})
    verdict = check_node("node2", instance_type="ml.p4de.24xlarge", run=runner(outputs))
    assert not verdict.passed
    assert "efa: not every EFA device of a p4de.24xlarge is visible (got 0; allowed 4)" in verdict.line()


def test_a_missing_gpu_fails():
    outputs = p4de_node(
        **{
            "nvidia-smi --query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total": tool(
                fabric_logs.NVIDIA_SMI_QUERY, gpu_rows(7, "NVIDIA A100-SXM4-80GB")
            )
        }
    )
    verdict = check_node("n", instance_type="ml.p4de.24xlarge", run=runner(outputs))
    assert [str(p) for p in verdict.problems] == [
        "gpus: not every GPU of a p4de.24xlarge is visible (got 7; allowed 8)"
    ]


def test_uncorrected_ecc_errors_fail():
    outputs = p4de_node(
        **{
            "nvidia-smi --query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total": tool(
                fabric_logs.NVIDIA_SMI_QUERY, gpu_rows(8, "NVIDIA A100-SXM4-80GB", ecc="3")
            )
        }
    )
    (found,) = check_node("n", instance_type="ml.p4de.24xlarge", run=runner(outputs)).problems
    assert found.key == "gpus.ecc"


def test_a_driver_failure_is_named_with_its_message():
    outputs = p4de_node(
        **{
            "nvidia-smi --query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total": tool(
                fabric_logs.NVIDIA_SMI_QUERY, sample("nvidia_smi_driver_failure.txt"), returncode=9
            )
        }
    )
    (found,) = check_node("n", instance_type="ml.p4de.24xlarge", run=runner(outputs)).problems
    assert found.key == "gpus" and "exit 9: NVIDIA-SMI has failed" in str(found)


def test_a_missing_dcgm_result_fails_when_a_level_was_asked_for(tmp_path):
    verdict = check_node(
        "n", instance_type="ml.p4de.24xlarge", dcgm_level=1, dcgm_json=tmp_path / "dcgm.json", run=runner(p4de_node())
    )
    (found,) = verdict.problems
    assert found.key == "dcgm" and "no DCGM level 1 result" in str(found)


def test_a_missing_tool_is_exit_127_not_a_traceback():
    done = run_tool(["moe-cdk-no-such-tool", "--version"])
    assert done.returncode == 127 and "not installed" in str(done.failure("x"))


def test_a_local_node_checks_the_cpu_stack_only():
    verdict = check_node("node1", instance_type=None, local=True)
    assert verdict.passed and verdict.facts[0].startswith("python ") and verdict.facts[1].startswith("torch ")


# -- nccl-tests logs ---------------------------------------------------------------------------------------------


def test_a_published_run_without_net_ofi_lines_cannot_prove_efa():
    # The 2x p5.48xlarge README run printed the table only: its bandwidth clears the floor, but nothing in it
    # says NCCL used EFA, so the one problem is the network.
    verdict = check_nccl_tests(
        sample("all_reduce_perf_p5_2node_srun.txt"),
        collective="all_reduce_perf",
        instance_type="ml.p5.48xlarge",
        nodes=2,
    )
    assert [p.key for p in verdict.problems] == ["all_reduce_perf.network"]


def test_a_real_efa_run_below_the_floor_fails_on_bandwidth_only():
    # A 2-node p4d.24xlarge run with NCCL_DEBUG=INFO (aws-efa-eks README): NET/OFI selected efa, and its
    # largest-message busbw is under the p4de floor. p4d and p4de have the same fabric (4 EFA, 400 Gbps).
    text = sample("all_reduce_perf_p4d_eks_nccl_info.txt")
    verdict = check_nccl_tests(text, collective="all_reduce_perf", instance_type="ml.p4de.24xlarge", nodes=2)
    assert [p.key for p in verdict.problems] == ["all_reduce_perf.busbw"]
    floor = catalog.fabric_floor("ml.p4de.24xlarge").all_reduce_busbw_gb_s
    assert f"{floor:g} GB/s or more" in verdict.line()


def test_the_floor_applies_only_across_nodes():
    text = sample("all_reduce_perf_p4d_eks_nccl_info.txt")
    assert check_nccl_tests(text, collective="all_reduce_perf", instance_type="ml.p4de.24xlarge", nodes=1).passed


def test_a_socket_fallback_fails_naming_the_network():
    text = sample("nccl_debug_socket_fallback.txt") + sample("all_reduce_perf_p5_2node_srun.txt")
    verdict = check_nccl_tests(text, collective="all_reduce_perf", instance_type="ml.p5.48xlarge", nodes=2)
    assert "NCCL is not using EFA (got 'network Socket, provider none'" in verdict.line()


def test_output_without_a_table_fails():
    verdict = check_nccl_tests(
        "srun: error: node1: task 0: Exited with exit code 1\n",
        collective="alltoall_perf",
        instance_type="ml.p5.48xlarge",
        nodes=2,
    )
    assert verdict.line() == (
        "preflight alltoall_perf: FAIL alltoall_perf: no result table in the output "
        "(got 'no rows'; allowed nccl-tests output)"
    )


# -- the torch benchmark's shape and figures ---------------------------------------------------------------------


def test_dispatch_shape_is_the_profiles():
    shape = dispatch_shape(load_train_config(ROOT / "training/configs/mixtral-8x7b.yaml"), world_size=16)
    # micro-batch 1 x seq 4096 over tensor parallel 2 (sequence parallel), hidden 4096, top-2, EP 8.
    assert (shape.tokens, shape.hidden, shape.top_k, shape.expert_parallel) == (2048, 4096, 2, 8)
    assert shape.bytes_per_rank(2) == 2048 * 2 * 4096 * 2


@pytest.mark.parametrize(("collective", "factor"), [("all_reduce", 2 * 7 / 8), ("all_to_all", 7 / 8)])
def test_bus_bandwidth_follows_nccl_tests_definitions(collective, factor):
    result = CollectiveResult(collective=collective, ranks=8, bytes_per_rank=10**9, time_us=10**4)
    assert result.algbw_gb_s == pytest.approx(100.0)
    assert result.busbw_gb_s == pytest.approx(100.0 * factor)


def test_a_failed_verdict_lists_every_problem():
    from moe_cdk.core.problems import problem

    verdict = Verdict(
        subject="n", problems=(problem("a", got=1, allowed="2").at("x"), problem("b", got=3, allowed="4").at("y"))
    )
    assert verdict.line() == "preflight n: FAIL x: a (got 1; allowed 2); y: b (got 3; allowed 4)"
