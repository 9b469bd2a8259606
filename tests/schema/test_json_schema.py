"""The JSON Schemas editors read: current, and they agree with the loader on the shipped files.
The schemas are checked with the jsonschema library, which is not ours."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from conftest import ROOT, SHIPPED_CONFIGS

from moe_cdk.cli.main import main
from moe_cdk.schema.config import SCHEMA_FILE, config_schema
from moe_cdk.training.config import SCHEMA_FILE as TRAINER_SCHEMA_FILE, train_config_schema

PROFILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "training/configs").glob("*.yaml"))


@pytest.mark.parametrize(
    "argv", [["--check", SCHEMA_FILE], ["--trainer", "--check", TRAINER_SCHEMA_FILE]], ids=["deployment", "trainer"]
)
def test_shipped_schema_is_current(argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["config-schema", *argv]) == 0, "stale JSON Schema: run `make docs`"


@pytest.mark.parametrize("path", SHIPPED_CONFIGS)
def test_every_shipped_configuration_meets_the_schema(path):
    jsonschema.Draft202012Validator(config_schema()).validate(yaml.safe_load((ROOT / path).read_text()))


@pytest.mark.parametrize("path", PROFILES)
def test_every_trainer_profile_meets_the_schema(path):
    jsonschema.Draft202012Validator(train_config_schema()).validate(yaml.safe_load((ROOT / path).read_text()))


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(unknown_key=1),
        lambda d: d["cluster"].update(orchestrator="nomad"),
        lambda d: d["cluster"]["instance_groups"][0].update(instance_count="two"),
        lambda d: d["cluster"]["instance_groups"][0].pop("instance_type"),
    ],
    ids=["unknown key", "unknown enum value", "wrong type", "missing key"],
)
def test_schema_refuses_what_the_loader_refuses(change):
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    change(data)
    assert list(jsonschema.Draft202012Validator(config_schema()).iter_errors(data))


@pytest.mark.parametrize("path", SHIPPED_CONFIGS + PROFILES)
def test_each_file_names_its_schema_for_the_yaml_language_server(path):
    first = (ROOT / path).read_text().splitlines()[0]
    schema = "moe-cdk.schema.json" if path.startswith("config/") else "moe-train.schema.json"
    assert first == f"# yaml-language-server: $schema={schema}"
    assert json.loads((ROOT / path).parent.joinpath(schema).read_text())["$schema"].endswith("2020-12/schema")
