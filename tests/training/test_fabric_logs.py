"""The fabric preflight's parsers on real tool output (tests/fixtures/fabric/, sources in SOURCES.md).

Each test reads one sample and asserts figures read off it by eye. The few inputs that are not real
captures (no citable one was found) are built from the tool's own source and say so where they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_cdk.core import catalog
from moe_cdk.training.fabric import logs as fabric_logs
from moe_cdk.training.fabric.logs import NcclRankDevice

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"


def sample(name: str) -> str:
    return (FIXTURES / name).read_text()


# ----------------------------------------------------------------------------------------------
# nccl-tests
# ----------------------------------------------------------------------------------------------


def test_srun_prefixed_table_reads_every_row_from_8_bytes_to_16_gib():
    rows = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p5_2node_srun.txt")).rows
    assert (len(rows), rows[0].size_bytes, rows[-1].size_bytes, rows[-1].count) == (32, 8, 17179869184, 4294967296)


def test_a_row_keeps_both_placements_and_its_columns():
    row = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p5_2node_srun.txt")).rows[-1]
    assert (row.dtype, row.redop, row.root) == ("float", "sum", -1)
    assert (row.out_of_place.time_us, row.out_of_place.algbw_gb_s, row.out_of_place.busbw_gb_s) == (
        66132.0,
        259.78,
        487.09,
    )
    assert (row.in_place.time_us, row.in_place.busbw_gb_s, row.in_place.wrong) == (66109.0, 487.26, 0)


def test_busbw_at_largest_takes_the_better_placement():
    # 16 GiB on 2x p5.48xlarge: 487.09 out-of-place, 487.26 in-place.
    assert fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p5_2node_srun.txt")).busbw_at_largest_gb_s == 487.26


def test_a_table_without_footer_has_no_average_or_out_of_bounds():
    result = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p4de_2node_srun.txt"))
    assert (len(result.rows), result.avg_busbw_gb_s, result.out_of_bounds) == (29, None, None)


def test_open_mpi_tagged_output_reads_its_footers():
    result = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p5_mpirun_batch.txt"))
    assert (len(result.rows), result.avg_busbw_gb_s, result.out_of_bounds) == (32, 156.742, 0)
    assert result.busbw_at_largest_gb_s == 483.35


def test_an_elided_excerpt_keeps_the_rows_around_the_ellipsis():
    result = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p5_eks_excerpt.txt"))
    assert [row.size_bytes for row in result.rows] == [0, 67108864, 134217728, 268435456, 536870912, 1073741824, 2**31]
    assert (result.avg_busbw_gb_s, result.busbw_at_largest_gb_s) == (52.9753, 437.89)


def test_nccl_info_lines_between_header_and_rows_do_not_break_the_table():
    text = sample("all_reduce_perf_p4d_eks_nccl_info.txt")
    assert "NCCL INFO Connected all trees" in text.split("#       size")[1]  # the sample interleaves them
    result = fabric_logs.parse_nccl_tests(text)
    assert (len(result.rows), result.rows[-1].size_bytes, result.busbw_at_largest_gb_s) == (30, 4294967296, 43.81)
    assert result.avg_busbw_gb_s == 11.2432


def test_the_pre_2_13_layout_has_no_root_and_its_error_column_is_no_wrong_count():
    row = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p4d_eks_nccl_info.txt")).rows[0]
    assert (row.size_bytes, row.redop, row.root, row.out_of_place.time_us) == (8, "sum", None, 179.1)
    assert (row.out_of_place.wrong, row.in_place.wrong) == (None, None)


def test_rank_lines_without_a_group_column():
    devices = fabric_logs.parse_nccl_tests(sample("all_reduce_perf_p4d_eks_nccl_info.txt")).devices
    assert len(devices) == 16
    assert devices[8] == NcclRankDevice(8, "nccl-tests-efa-16-worker-1", 0, "A100-SXM4-40GB")


def test_alltoall_row_has_no_reduction_and_an_unchecked_in_place():
    row = fabric_logs.parse_nccl_tests(sample("alltoall_perf_rtx5090_single.txt")).rows[0]
    assert (row.size_bytes, row.count, row.redop, row.root) == (33554432, 8388608, "none", -1)
    assert (row.out_of_place.algbw_gb_s, row.out_of_place.wrong) == (1715.44, 0)
    assert (row.in_place.algbw_gb_s, row.in_place.wrong) == (43046.10, None)


def test_alltoall_footers_and_rank_line_with_a_short_pci_id():
    result = fabric_logs.parse_nccl_tests(sample("alltoall_perf_rtx5090_single.txt"))
    assert (result.avg_busbw_gb_s, result.out_of_bounds) == (0.0, 0)
    assert result.devices == (NcclRankDevice(0, "GENOA-01", 0, "NVIDIA GeForce RTX 5090"),)


def test_rows_without_a_header_are_read_in_the_2_13_layout():
    result = fabric_logs.parse_nccl_tests(sample("alltoall_perf_rows_mpirun_bottlerocket.txt"))
    assert (len(result.rows), result.rows[-1].size_bytes, result.busbw_at_largest_gb_s) == (9, 262144, 1.60)
    assert {row.in_place.wrong for row in result.rows} == {None}


def test_rank_line_with_a_pci_domain_and_collapsed_blanks():
    # nccl-tests 2.14 and later print [0000:16:00]; the copy collapsed the column padding.
    devices = fabric_logs.parse_nccl_tests(sample("nccl_debug_socket_fallback.txt")).devices
    assert devices == (NcclRankDevice(0, "node", 0, "NVIDIA GeForce RTX 5090"),)


def test_text_without_a_table_gives_a_result_without_rows():
    result = fabric_logs.parse_nccl_tests(sample("nccl_debug_ofi_1.16.2_g6e.txt"))
    assert (result.rows, result.busbw_at_largest_gb_s, result.wrong_total, result.avg_busbw_gb_s) == ((), None, 0, None)


def test_wrong_total_adds_both_placements():
    # Not a capture: every sample above validated clean. A p5 row with its #wrong columns set to 3 and
    # to nccl-tests' %g form of a million (src/util.cu writeBenchmarkLineBody prints "%6g").
    row = (
        "0:  17179869184    4294967296     float     sum      -1"
        "    66132  259.78  487.09      3    66109  259.87  487.26  1e+06"
    )
    assert fabric_logs.parse_nccl_tests(row).wrong_total == 1_000_003


def test_per_iteration_columns_and_timestamp_are_skipped():
    # Not a capture: the header and row of `-I 1 -S 1` as NVIDIA/nccl-tests src/util.cu (a0b82b2)
    # writeResultHeader and writeBenchmarkLineBody/writePerIterReport/writeTimestamp print them.
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
        "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
        "           timestamp\n"
        "   268435456      67108864     float     sum      -1   1468.2  182.83  342.81       0   1401.0   1533.9"
        "   1533.9     2.10   1452.7  184.78  346.46       0   1400.2   1511.0   1511.0     1.90"
        "  2026-01-02 03:04:05\n"
    )
    row = fabric_logs.parse_nccl_tests(text).rows[0]
    assert (row.out_of_place.busbw_gb_s, row.in_place.time_us, row.in_place.busbw_gb_s) == (342.81, 1452.7, 346.46)


def test_published_samples_clear_their_catalog_floors():
    # The floors are fractions of these very runs (core/catalog.py): each must stay below its source.
    for name, instance in (
        ("all_reduce_perf_p5_2node_srun.txt", "p5.48xlarge"),
        ("all_reduce_perf_p4de_2node_srun.txt", "p4de.24xlarge"),
    ):
        busbw = fabric_logs.parse_nccl_tests(sample(name)).busbw_at_largest_gb_s
        assert catalog.fabric_floor(instance).all_reduce_busbw_gb_s < busbw


# ----------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO
# ----------------------------------------------------------------------------------------------


def test_aws_ofi_nccl_1_16_reports_provider_fabric_and_nics():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_ofi_1.16.2_g6e.txt"))
    assert (report.nccl_version, report.ofi_plugin_version) == ("2.27.3+cuda12.9", "1.16.2")
    assert (report.provider, report.fabric, report.nic_count, report.networks) == ("efa", "efa", 4, ("Libfabric",))


def test_aws_ofi_nccl_1_16_on_its_libfabric_network_uses_efa():
    assert fabric_logs.parse_nccl_debug(sample("nccl_debug_ofi_1.16.2_g6e.txt")).uses_efa is True


def test_collnet_profiler_and_tuner_lookups_are_not_plugin_failures():
    text = sample("nccl_debug_ofi_1.16.2_g6e.txt")
    for line in (
        "NET/Plugin: Failed to find ncclCollNetPlugin_v10 symbol.",
        "PROFILER/Plugin: Could not find: libnccl-profiler.so.",
        "TUNER/Plugin: Failed to find ncclTunerPlugin_v4 symbol.",
    ):
        assert line in text
    assert fabric_logs.parse_nccl_debug(text).plugin_failures == ()


def test_aws_ofi_nccl_1_7_spelling_with_a_nic_count():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_ofi_1.7.3_srun.txt"))
    assert (report.ofi_plugin_version, report.provider, report.fabric, report.nic_count) == (
        "1.7.3-aws",
        "efa",
        None,
        4,
    )


def test_a_log_that_never_names_the_network_does_not_prove_efa():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_ofi_1.7.3_srun.txt"))
    assert (report.network, report.uses_efa) == (None, False)


def test_p5en_log_finds_16_nics_on_libfabric():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_ofi_p5en_16nics.txt"))
    assert (report.provider, report.nic_count, report.network, report.uses_efa) == ("efa", 16, "Libfabric", True)


def test_the_oldest_plugin_prints_no_nic_count_and_names_aws_libfabric():
    report = fabric_logs.parse_nccl_debug(sample("all_reduce_perf_p4d_eks_nccl_info.txt"))
    assert (report.nccl_version, report.ofi_plugin_version, report.provider, report.nic_count) == (
        "2.9.9+cuda11.2",
        None,
        "efa",
        None,
    )
    assert (report.networks, report.uses_efa, report.plugin_failures) == (("AWS Libfabric",), True, ())


def test_socket_fallback_is_not_efa():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_socket_fallback.txt"))
    assert (report.nccl_version, report.provider, report.network, report.uses_efa) == (
        "2.25.1+cuda12.4",
        None,
        "Socket",
        False,
    )


def test_socket_fallback_names_the_missing_plugin():
    report = fabric_logs.parse_nccl_debug(sample("nccl_debug_socket_fallback.txt"))
    assert report.plugin_failures == ("NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",)


def test_one_rank_on_socket_spoils_an_efa_provider():
    # Real lines from two logs: ranks that chose Libfabric, and one that fell back to Socket.
    text = sample("nccl_debug_ofi_1.16.2_g6e.txt") + sample("nccl_debug_socket_fallback.txt")
    report = fabric_logs.parse_nccl_debug(text)
    assert (report.provider, report.networks, report.uses_efa) == ("efa", ("Libfabric", "Socket"), False)
    assert report.nccl_version == "2.27.3+cuda12.9"  # the first log's: the first value printed wins


@pytest.mark.parametrize(
    ("name", "failures"),
    [
        (
            "nccl_debug_plugin_not_found_nccl_2_18.txt",
            (
                "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object "
                "file: No such file or directory",
                "NET/Plugin : No plugin found, using internal implementation",
            ),
        ),
        (
            "nccl_debug_plugin_not_found_nccl_2_19.txt",
            (
                "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No "
                "plugin found (libnccl-net.so), using internal implementation",
            ),
        ),
        (
            "nccl_debug_plugin_not_found_nccl_2_21.txt",
            (
                "NET/Plugin: No plugin found (libnccl-net.so)",
                "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file "
                "or directory : when loading libnccl-net.so",
            ),
        ),
    ],
    ids=["nccl-2.18", "nccl-2.19", "nccl-2.21"],
)
def test_each_nccl_release_wording_of_a_missing_plugin_is_a_failure(name, failures):
    assert fabric_logs.parse_nccl_debug(sample(name)).plugin_failures == failures


def test_nccl_version_on_a_line_of_its_own():
    assert fabric_logs.parse_nccl_debug(sample("nccl_debug_plugin_not_found_nccl_2_21.txt")).nccl_version == (
        "2.21.5+cuda12.6"
    )


def test_efa_direct_fabric_spelling():
    # Not a capture (none citable was found): aws-ofi-nccl's format since v1.14.0, src/nccl_ofi_net.cpp
    # "Selected provider is %s, fabric is %s (found %d nics)", in NCCL's INFO line shape.
    line = "ip-10-1-2-3:100:200 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)"
    report = fabric_logs.parse_nccl_debug(line)
    assert (report.provider, report.fabric, report.nic_count) == ("efa", "efa-direct", 16)


# ----------------------------------------------------------------------------------------------
# fi_info
# ----------------------------------------------------------------------------------------------


def test_user_guide_p4d_lists_four_rdm_domains():
    info = fabric_logs.parse_fi_info(sample("fi_info_p4d_efa_user_guide.txt"))
    assert info.domains == ("efa_0-rdm", "efa_1-rdm", "efa_2-rdm", "efa_3-rdm")
    assert info.device_count == 4


def test_user_guide_entry_keeps_a_fabric_with_colons():
    entry = fabric_logs.parse_fi_info(sample("fi_info_p4d_efa_user_guide.txt")).entries[0]
    assert (entry.provider, entry.fabric, entry.version, entry.endpoint_type, entry.protocol) == (
        "efa",
        "EFA-fe80::c6e:8fff:fef6:e7ff",
        "111.0",
        "FI_EP_RDM",
        "FI_PROTO_EFA",
    )


def test_efa_direct_and_datagram_entries_count_one_device():
    info = fabric_logs.parse_fi_info(sample("fi_info_efa_direct.txt"))
    assert [entry.fabric for entry in info.entries] == ["efa-direct", "efa", "efa"]
    assert (info.domains, info.device_count) == (("rdmap47s0-rdm", "rdmap47s0-dgrm"), 1)


def test_no_efa_devices_is_no_entries():
    info = fabric_logs.parse_fi_info(sample("fi_info_no_efa_devices.txt"))
    assert (info.entries, info.device_count) == ((), 0)


def test_fi_info_version_of_the_efa_installer_build():
    version = fabric_logs.parse_fi_info_version(sample("fi_info_version_amzn.txt"))
    assert (version.fi_info, version.libfabric, version.api, str(version)) == (
        "1.19.0amzn3.0",
        "1.19.0amzn3.0",
        "1.19",
        "1.19.0amzn3.0",
    )


def test_fi_info_version_absent_is_none():
    assert fabric_logs.parse_fi_info_version(sample("fi_info_no_efa_devices.txt")) is None


# ----------------------------------------------------------------------------------------------
# nvidia-smi
# ----------------------------------------------------------------------------------------------

# Not a capture: no published output of this exact query was found. Two rows in nvidia-smi's
# csv,noheader,nounits form (", " between fields, memory.total in MiB without its unit); the names are
# those of the nccl-tests samples' devices, the UUIDs NVIDIA's form.
NVIDIA_SMI_ROWS = (
    "0, NVIDIA H100 80GB HBM3, GPU-3c2e38d1-6a2c-4a31-b44b-9d82a8c80735, 81559, 0\n"
    "1, NVIDIA H100 80GB HBM3, GPU-722d1344-1b6d-4a95-8cb9-1c572eb5ad94, 81559, [N/A]\n"
)


def test_nvidia_smi_query_is_the_documented_command():
    assert fabric_logs.NVIDIA_SMI_QUERY == (
        "nvidia-smi",
        "--query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total",
        "--format=csv,noheader,nounits",
    )


def test_nvidia_smi_rows_become_gpus():
    first, _ = fabric_logs.parse_nvidia_smi(NVIDIA_SMI_ROWS)
    assert (first.index, first.name, first.uuid, first.memory_total_mib, first.ecc_uncorrected) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "GPU-3c2e38d1-6a2c-4a31-b44b-9d82a8c80735",
        81559,
        0,
    )


@pytest.mark.parametrize("unreported", ["[N/A]", "N/A", "[Not Supported]"])
def test_nvidia_smi_unreported_ecc_is_none(unreported):
    line = f"1, NVIDIA H100 80GB HBM3, GPU-722d1344-1b6d-4a95-8cb9-1c572eb5ad94, 81559, {unreported}"
    assert fabric_logs.parse_nvidia_smi(line)[0].ecc_uncorrected is None


def test_nvidia_smi_driver_failure_raises_naming_the_line():
    with pytest.raises(ValueError, match=r"nvidia-smi line 1: expected index, name, uuid.*NVIDIA-SMI has failed"):
        fabric_logs.parse_nvidia_smi(sample("nvidia_smi_driver_failure.txt"))


def test_nvidia_smi_non_numeric_ecc_raises():
    with pytest.raises(ValueError, match=r"ecc\.errors\.uncorrected\.volatile\.total is not a number"):
        fabric_logs.parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, GPU-3c2e38d1, 81559, many")


# ----------------------------------------------------------------------------------------------
# dcgmi diag -j
# ----------------------------------------------------------------------------------------------

# Not captures (see SOURCES.md): documents in the shapes NVIDIA/DCGM's dcgmi/Diag.cpp writes.
# DCGM 3.x (v3.3.9 HelperJsonBuildOutput): "DCGM GPU Diagnostic", plugin results per GPU under a string
# "gpu_id", warnings as {"warning", "error_id", ...}, version and driver at the top level; Deployment
# tests write their message under "warnings" inside the warning entry; arrays may hold nulls.
DCGM3_FAIL = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {"name": "Denylist", "results": [{"status": "Pass"}]},
                    None,
                    {
                        "name": "Persistence Mode",
                        "results": [
                            {
                                "gpu_id": 0,
                                "status": "Fail",
                                "warnings": [{"warnings": "Persistence mode for GPU 0 is disabled.", "error_id": 29}],
                            }
                        ],
                    },
                ],
            },
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "GPU Memory",
                        "results": [
                            {"gpu_id": "0", "status": "Pass"},
                            {
                                "gpu_id": "1",
                                "status": "Fail",
                                "warnings": [
                                    {"warning": "Memory errors detected.", "error_id": 3, "error_severity": 2}
                                ],
                            },
                        ],
                    }
                ],
            },
        ]
    },
    "version": "3.3.9",
    "Driver Version Detected": "550.54.15",
}

# DCGM 4.x (v4.2.3 HelperJsonBuildOutput and testing/python3/dcgm_diag_schema.json): "DCGM Diagnostic",
# results per entity (entity_group, entity_group_id, entity_id), a test_summary per test, and metadata.
DCGM4_PASS = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "memory",
                        "results": [
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"},
                        ],
                        "test_summary": {"status": "Pass"},
                    }
                ],
            }
        ]
    },
    "entity_groups": [
        {"entity_group": "GPU", "entity_group_id": 1, "entities": [{"entity_id": 0, "device_id": "2330"}]}
    ],
    "metadata": {"version": "4.2.3", "Driver Version Detected": "570.148.08"},
}


def dcgm4_with(results: list[dict], summary: dict) -> str:
    document = json.loads(json.dumps(DCGM4_PASS))
    test = document["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"], test["test_summary"] = results, summary
    return json.dumps(document)


def test_dcgm3_failures_name_test_gpu_and_message():
    diag = fabric_logs.parse_dcgm_diag(json.dumps(DCGM3_FAIL))
    assert diag.passed is False
    assert diag.failures == (
        "Persistence Mode (GPU 0): Persistence mode for GPU 0 is disabled.",
        "GPU Memory (GPU 1): Memory errors detected.",
    )


def test_dcgm3_version_from_the_top_level():
    assert fabric_logs.parse_dcgm_diag(json.dumps(DCGM3_FAIL)).dcgm_version == "3.3.9"


def test_dcgm4_all_pass():
    diag = fabric_logs.parse_dcgm_diag(json.dumps(DCGM4_PASS))
    assert (diag.passed, diag.failures, diag.dcgm_version) == (True, (), "4.2.3")


def test_dcgm4_failed_entity_names_its_gpu():
    text = dcgm4_with(
        [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entity_id": 1,
                "status": "Fail",
                "warnings": [{"warning": "DBE detected", "error_id": 3, "error_category": 1, "error_severity": 2}],
            },
        ],
        {"status": "Fail"},
    )
    assert fabric_logs.parse_dcgm_diag(text).failures == ("memory (GPU 1): DBE detected",)


def test_dcgm4_failed_summary_without_a_failed_entity_names_the_test():
    text = dcgm4_with(
        [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}],
        {"status": "Fail", "warnings": [{"warning": "test timed out", "error_id": 1}]},
    )
    assert fabric_logs.parse_dcgm_diag(text).failures == ("memory: test timed out",)


def test_dcgm_warn_is_not_a_failure():
    text = dcgm4_with(
        [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Warn"}], {"status": "Warn"}
    )
    diag = fabric_logs.parse_dcgm_diag(text)
    assert (diag.passed, diag.warnings) == (True, ("memory (GPU 0)",))


def test_dcgm_runtime_error_fails():
    text = json.dumps({"DCGM GPU Diagnostic": {"version": "3.3.9", "runtime_error": "Unable to run diagnostic"}})
    assert fabric_logs.parse_dcgm_diag(text).failures == ("runtime error: Unable to run diagnostic",)


def test_dcgm_document_without_results_does_not_pass():
    diag = fabric_logs.parse_dcgm_diag(json.dumps({"DCGM Diagnostic": {"test_categories": []}}))
    assert (diag.passed, diag.failures) == (False, ("no test results in the dcgmi diag output",))


def test_dcgm_text_before_the_json_is_skipped():
    text = "Successfully ran diagnostic for group.\n" + json.dumps(DCGM4_PASS)
    assert fabric_logs.parse_dcgm_diag(text).passed is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Error: unable to establish a connection to the specified host: localhost", "holds no JSON object"),
        # How the author of NVIDIA/DCGM issue #139 elided a category.
        ('{"DCGM GPU Diagnostic" : {"test_categories" : [{"..."}]}}', "is not valid JSON"),
        (json.dumps({"body": {}, "header": ["NVLINK Error Counts"]}), "no 'DCGM Diagnostic'"),
    ],
    ids=["no-json", "elided-json", "other-dcgmi-document"],
)
def test_dcgm_malformed_output_raises(text, message):
    with pytest.raises(ValueError, match=message):
        fabric_logs.parse_dcgm_diag(text)
