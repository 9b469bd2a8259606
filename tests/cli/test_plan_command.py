"""``moe-cdk plan``: the table or JSON on stdout, exit 0; problems on stderr, exit 2."""

from __future__ import annotations

import argparse
import json

from conftest import ROOT

from moe_cdk.cli.plan import add_parser

MOE_8X1B = ROOT / "training/configs/moe-8x1b.yaml"


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="c")
    add_parser(sub)
    args = p.parse_args(["plan", *argv])
    return args.run(args)


def test_cli_prints_the_table_and_exits_0(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml")) == 0
    out = capsys.readouterr().out
    for label in ("layout", "parameters", "activations", "total", "cluster cost", "tokens/s", "recommendation"):
        assert label in out
    assert "TP2 PP1 EP8 ETP1 DP8 (expert DP2) SP on 16 ranks" in out


def test_cli_json(capsys):
    assert run_cli("--config", str(ROOT / "config/existing-vpc.yaml"), "--json", "--mfu", "0.4") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mfu"] == 0.4 and data["memory_gib"]["fits"] is True
    assert data["profile"] == "training/configs/moe-8x1b.yaml"


def test_cli_train_config_option(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), "--train-config", str(MOE_8X1B)) == 0
    assert "moe-8x1b.yaml" in capsys.readouterr().out


TOO_BIG = ("--set", "parallel.expert=1", "--set", "parallel.tensor=1", "--set", "parallel.expert_tensor=1")


def test_cli_exits_2_when_it_does_not_fit_naming_the_largest_term_and_what_shrinks_it(capsys):
    path = str(ROOT / "config/default.yaml")
    assert run_cli("--config", path, *TOO_BIG) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"{path}: 1 problem(s)"
    assert lines[1].startswith(
        "  training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory; the largest term is "
        "gradients at 174.0 GiB: try parallel.expert above 1, or parallel.tensor above 1, or parallel.pipeline "
        "above 1, "
        "or more nodes (got '350.9 GiB per device'"
    )


def test_cli_prints_the_breakdown_of_a_plan_that_does_not_fit(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), *TOO_BIG) == 2
    out = capsys.readouterr().out
    assert "  gradients" in out and "  activations" in out and "  fits              NO" in out


def test_cli_json_of_a_plan_that_does_not_fit_is_json_with_its_problems(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), *TOO_BIG, "--json") == 2
    data = json.loads(capsys.readouterr().out)
    assert data["memory_gib"]["fits"] is False
    assert [p.split(";")[0] for p in data["problems"]] == [
        "training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory"
    ]


def test_an_expert_parallel_group_across_nodes_is_noted(capsys):
    overrides = ("--set", "moe.num_experts=16", "--set", "parallel.expert=16", "--set", "parallel.tensor=1")
    run_cli("--config", str(ROOT / "config/default.yaml"), *overrides)
    assert (
        "the expert-parallel group spans nodes (EP 16 x ETP 1 = 16 ranks, 8 ranks per node): "
        "the MoE all-to-all crosses EFA, not NVLink"
    ) in capsys.readouterr().out


def test_an_expert_parallel_group_within_a_node_is_not_noted(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml")) == 0
    assert "spans nodes" not in capsys.readouterr().out


def test_cli_exits_2_on_an_invalid_configuration(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("region: nowhere\ncluster: {availability_zone: x, instance_groups: []}\n")
    assert run_cli("--config", str(bad)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{bad}: ") and err[0].endswith("problem(s)")
    assert all(line.startswith("  ") for line in err[1:]) and len(err) > 1


def test_cli_exits_2_on_a_bad_mfu(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), "--mfu", "1.5") == 2
    assert "--mfu: model FLOPs utilisation out of range" in capsys.readouterr().err
