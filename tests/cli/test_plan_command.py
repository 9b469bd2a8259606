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


def test_cli_exits_2_when_it_does_not_fit(capsys):
    path = str(ROOT / "config/default.yaml")
    assert (
        run_cli(
            "--config",
            path,
            "--set",
            "parallel.expert=1",
            "--set",
            "parallel.tensor=1",
            "--set",
            "parallel.expert_tensor=1",
        )
        == 2
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0] == f"{path}: 1 problem(s)"
    assert lines[1].startswith(
        "  training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory (got "
    )


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
