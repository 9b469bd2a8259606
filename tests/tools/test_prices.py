"""Prices with their provenance: every entry of tools/prices.yaml says where its figure comes from, when it was
read and whether it is confirmed, and `moe-cdk plan` shows all three for each price it sums (text and --json)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT

from moe_cdk.cli.main import main
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import load_config
from moe_cdk.tools.plan import load_price_entries, plan, render_table, to_json

PRICES = yaml.safe_load((ROOT / "tools/prices.yaml").read_text())
DEFAULT = ROOT / "config/default.yaml"


def prices_used(config_path):
    """The shipped entries for config_path's groups, read from the file, not from plan."""
    config = load_config(config_path)
    entries = load_price_entries()
    types = dict.fromkeys(g.instance_type for g in config.cluster.instance_groups)
    return [entries[(t, config.region)] for t in types]


def write_prices(tmp_path, entries):
    (path := tmp_path / "prices.yaml").write_text(yaml.safe_dump({"prices": entries}))
    return path


@pytest.mark.parametrize("config_path", [DEFAULT, ROOT / "config/eks-autoscaling.yaml"], ids=lambda p: p.name)
def test_plan_prints_each_price_with_its_source_date_and_confirmation(config_path, capsys):
    main(["plan", "--config", str(config_path)])
    lines = capsys.readouterr().out.splitlines()
    for price in prices_used(config_path):
        (line,) = [line for line in lines if line.lstrip().startswith("price") and price.instance_type in line]
        assert price.source in line and f"retrieved {price.retrieved}" in line
        assert ("UNCONFIRMED" in line) is (not price.confirmed)


def test_plan_json_carries_each_price_with_its_source_date_and_confirmation(capsys):
    main(["plan", "--config", str(DEFAULT), "--json"])
    shown = json.loads(capsys.readouterr().out)["prices"]
    assert [(p["instance_type"], p["source"], p["retrieved"], p["confirmed"]) for p in shown] == [
        (p.instance_type, p.source, p.retrieved, p.confirmed) for p in prices_used(DEFAULT)
    ]


def test_a_confirmed_price_is_shown_as_confirmed(tmp_path):
    entries = [dict(e, confirmed=True, source="a page read by a test") for e in PRICES["prices"]]
    result = plan(load_config(DEFAULT), prices_path=write_prices(tmp_path, entries))
    assert result.prices and all(p.confirmed for p in result.prices)
    table = render_table(result)
    assert "UNCONFIRMED" not in table and "a page read by a test" in table
    assert all(p["confirmed"] for p in to_json(result)["prices"])


@pytest.mark.parametrize("field", ["source", "retrieved", "confirmed"])
def test_a_price_without_its_provenance_is_refused_with_one_line(tmp_path, field):
    entries = [dict(e) for e in PRICES["prices"]]
    index = next(i for i, e in enumerate(entries) if e["instance_type"] == "ml.trn2.48xlarge")
    del entries[index][field]
    with pytest.raises(ConfigError) as error:
        plan(load_config(DEFAULT), prices_path=write_prices(tmp_path, entries))
    (line,) = error.value.errors
    assert line.startswith(f"prices.yaml: prices[{index}].{field}: ml.trn2.48xlarge in us-east-1 has no {field} (")
    assert "\n" not in line


def test_a_price_with_an_unreadable_date_is_refused(tmp_path):
    entries = [dict(e) for e in PRICES["prices"]]
    entries[0]["retrieved"] = "last week"
    with pytest.raises(ConfigError) as error:
        plan(load_config(DEFAULT), prices_path=write_prices(tmp_path, entries))
    assert [p.key for p in error.value.problems] == ["prices.yaml: prices[0].retrieved"]
