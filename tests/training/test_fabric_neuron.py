"""Trainium's preflight verdicts: ``neuron-ls -j`` against the catalog (training/fabric/neuron.py, through
``check_node``), and nccom-test output (``check_nccom_test``), on AWS's documented samples
(tests/fixtures/neuron/SOURCES.md) and on outputs composed in their documented format."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from moe_cdk.core import catalog
from moe_cdk.training.fabric import neuron
from moe_cdk.training.fabric.preflight import ToolOutput, check_nccom_test, check_node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/neuron"
TRN2 = "ml.trn2.48xlarge"


def sample(name: str) -> str:
    return (FIXTURES / name).read_text()


def neuron_ls(devices: int = 16, cores: int = 4, lnc: int = 2, busy: Sequence[int] = ()) -> str:
    """``neuron-ls -j`` in its documented shape: one object per device."""
    return json.dumps(
        [
            {
                "neuron_device": i,
                "bdf": f"{0xCC + i:02x}:00.0",
                "cpu_affinity": "0-95",
                "numa_node": "0",
                "connected_to": [(i + 1) % 16, (i + 15) % 16],
                "nc_count": cores,
                "logical_neuroncore_config": lnc,
                "memory_size": 103079215104,
                "neuroncore_ids": list(range(i * cores, (i + 1) * cores)),
                "neuron_processes": [{"pid": 7, "command": "python train.py"}] if i in busy else [],
            }
            for i in range(devices)
        ]
    )


def fi_info(devices: int) -> str:
    return "".join(
        f"provider: efa\n    fabric: EFA-fe80::{i:x}\n    domain: rdmap{i}s0-rdm\n    version: 122.0\n"
        "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n"
        for i in range(devices)
    )


def node(neuron_ls_json: str, efa: int = 16):
    outputs = {
        "neuron-ls --json-output": ToolOutput(argv=neuron.NEURON_LS, returncode=0, stdout=neuron_ls_json),
        "fi_info -p": ToolOutput(argv=("fi_info", "-p", "efa"), returncode=0, stdout=fi_info(efa)),
    }

    def run(argv: Sequence[str]) -> ToolOutput:
        return outputs.get(" ".join(argv[:2]), ToolOutput(argv=tuple(argv), returncode=127, stderr="not found"))

    return run


def test_a_healthy_trn2_node_passes_with_its_devices_cores_and_efa():
    verdict = check_node("trn-1", instance_type=TRN2, run=node(neuron_ls()))
    assert verdict.line() == "preflight trn-1: PASS 16/16 Trainium2 devices, 64 NeuronCores, 16/16 EFA devices"


def test_the_documented_neuron_ls_sample_parses():
    devices = neuron.parse_neuron_ls(sample("neuron_ls_trn2_doc.json"))
    assert [(d.index, d.cores, d.logical_nc_config) for d in devices] == [(0, 4, 2), (15, 4, 2)]
    assert devices[0].memory_bytes == round(catalog.lookup(TRN2).accelerator_memory_gib * 2**30)


def test_missing_devices_and_a_process_holding_one_fail_the_node():
    verdict = check_node("trn-1", instance_type=TRN2, run=node(sample("neuron_ls_trn2_doc.json")))
    keys = [p.key for p in verdict.problems]
    assert keys == ["neuron", "neuron.cores", "neuron"]
    assert "neuron-bench exec" in str(verdict.problems[2])


def test_logical_core_config_1_is_not_the_ranks_the_job_starts():
    verdict = check_node("trn-1", instance_type=TRN2, run=node(neuron_ls(cores=8, lnc=1)))
    (found,) = verdict.problems
    assert found.key == "neuron.cores" and "got '128 (logical NeuronCore config [1])'" in str(found)


def test_missing_efa_devices_fail_a_trn2_node():
    verdict = check_node("trn-1", instance_type=TRN2, run=node(neuron_ls(), efa=8))
    assert [p.key for p in verdict.problems] == ["efa"]


def test_unreadable_neuron_ls_output_is_a_problem_not_a_crash():
    verdict = check_node("trn-1", instance_type=TRN2, run=node("neuron-ls: no devices"))
    assert verdict.problems[0].key == "neuron" and "unreadable" in str(verdict.problems[0])


def test_nccom_test_table_with_time_us_parses():
    result = neuron.parse_nccom_test(sample("nccom_test_allr_2rank.txt"))
    assert (len(result.rows), result.busbw_at_largest_gib_s, result.average_busbw_gib_s) == (11, 52.83, 23.6671)


def test_nccom_test_table_with_percentiles_and_a_tab_parses():
    result = neuron.parse_nccom_test(sample("nccom_test_allg_stats.txt"))
    assert (len(result.rows), result.busbw_at_largest_gib_s, result.average_busbw_gib_s) == (4, 30.92, 9.1966)


def test_a_failed_nccom_test_run_fails_its_verdict():
    verdict = check_nccom_test(sample("nccom_test_failure.txt"), operation="all_reduce", instance_type=TRN2, nodes=2)
    assert [p.key for p in verdict.problems] == ["nccom_all_reduce", "nccom_all_reduce"]
    assert "1 errors found - test failed" in str(verdict.problems[0])


def test_a_single_node_run_is_reported_without_a_floor():
    verdict = check_nccom_test(sample("nccom_test_allr_2rank.txt"), operation="all_reduce", instance_type=TRN2, nodes=1)
    assert (
        verdict.line()
        == "preflight nccom_all_reduce: PASS busbw 52.83 GiB/s at 1073741824 B, average busbw 23.67 GiB/s"
    )


def test_the_all_reduce_floor_is_half_the_nodes_efa_line_rate_in_gib_s():
    # 3,200 Gbps = 400 x 10**9 B/s = 372.53 GiB/s a trn2 node; half of it, whatever the ranks per node.
    assert neuron.nccom_floor_gib_s(catalog.lookup(TRN2), "all_reduce") == pytest.approx(3200e9 / 8 / 2**30 / 2)


def test_an_all_reduce_across_nodes_at_a_fraction_of_the_line_rate_fails():
    # 52.83 GiB/s, a 2-rank run on one node, is far above a per-rank share but a seventh of the node's EFA.
    verdict = check_nccom_test(sample("nccom_test_allr_2rank.txt"), operation="all_reduce", instance_type=TRN2, nodes=2)
    (found,) = verdict.problems
    assert found.key == "nccom_all_reduce.busbw" and "186.26 GiB/s or more" in str(found)


def test_the_alltoall_floor_is_half_the_line_rate_per_rank_in_gib_s():
    assert neuron.nccom_floor_gib_s(catalog.lookup(TRN2), "alltoall") == pytest.approx(3200e9 / 8 / 2**30 / 2 / 64)


def alltoall_at(busbw: str) -> str:
    return sample("nccom_test_allr_2rank.txt").replace("52.83          52.83", f"52.83           {busbw}")


def test_an_alltoall_across_nodes_below_its_floor_fails():
    verdict = check_nccom_test(alltoall_at("2.50"), operation="alltoall", instance_type=TRN2, nodes=2)
    (found,) = verdict.problems
    assert found.key == "nccom_alltoall.busbw" and "2.50 GiB/s" in str(found) and "2.91 GiB/s or more" in str(found)


def test_an_alltoall_above_its_gib_s_floor_passes():
    # 3.00 GiB/s is 3.22 GB/s: above half the line rate per rank in either unit (2.91 GiB/s, 3.125 GB/s).
    assert check_nccom_test(alltoall_at("3.00"), operation="alltoall", instance_type=TRN2, nodes=2).passed
