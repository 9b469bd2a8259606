"""The typed configuration: what loads, what is rejected and how the rejection reads."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import yaml
from conftest import ROOT, SHIPPED_CONFIGS, config_errors

from moe_cdk.core.loader import field_docs
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema import config as config_module
from moe_cdk.schema.config import Config, ConfigError, NodeRole, Orchestrator, load_config, parse_config, reference_docs

ERROR_LINE = re.compile(r"^[A-Za-z_][\w.\[\]]*: .+ \(got .+; allowed .+\)$", re.DOTALL)
DEFAULT = yaml.safe_load((ROOT / "config/default.yaml").read_text())


def errors_for(mutate) -> list[str]:
    return config_errors(DEFAULT, mutate)


def _set(path: str, value):
    """A mutation that sets a dotted path (list indices as numbers) in the parsed YAML."""

    def mutate(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _associations(*pairs):
    return [{"file_system_path": fs, "s3_prefix": s3} for fs, s3 in pairs]


INVALID = [
    pytest.param(
        _set("storage.lustre.storage_capacity_gib", 1000),
        "storage.lustre.storage_capacity_gib: not a PERSISTENT_2 SSD capacity (got 1000;",
        id="capacity-1000",
    ),
    pytest.param(
        _set("storage.lustre.storage_capacity_gib", 3600),
        "storage.lustre.storage_capacity_gib: not a PERSISTENT_2 SSD capacity (got 3600;",
        id="capacity-3600",
    ),
    pytest.param(
        _set("storage.lustre.per_unit_storage_throughput_mb_s_tib", 300),
        "storage.lustre.per_unit_storage_throughput_mb_s_tib: not a PERSISTENT_2 throughput tier (got 300;",
        id="throughput-300",
    ),
    pytest.param(
        _set("storage.data_repository.associations", _associations(*[(f"/d{i}", f"d{i}") for i in range(9)])),
        "storage.data_repository.associations: too many data repository associations",
        id="nine-dras",
    ),
    pytest.param(
        _set("storage.data_repository.associations", _associations(("/data", "a"), ("/data", "b"))),
        "storage.data_repository.associations[1].file_system_path: overlaps associations[0].file_system_path",
        id="duplicate-dra-path",
    ),
    pytest.param(
        _set("storage.data_repository.associations", _associations(("/data", "a"), ("/data/sub", "b"))),
        "storage.data_repository.associations[1].file_system_path: overlaps",
        id="nested-dra-path",
    ),
    pytest.param(
        _set("storage.data_repository.associations", _associations(("/a", "data"), ("/b", "data"))),
        "storage.data_repository.associations[1].s3_prefix: overlaps associations[0].s3_prefix",
        id="duplicate-prefix",
    ),
    pytest.param(
        _set("storage.data_repository.associations.0.imported_file_chunk_size_mib", 600000),
        "storage.data_repository.associations[0].imported_file_chunk_size_mib: out of range (got 600000;",
        id="chunk-size",
    ),
    pytest.param(
        _set("storage.data_repository.associations.0.auto_import_events", ["NEW", "RENAMED"]),
        "storage.data_repository.associations[0].auto_import_events[1]: unknown value (got 'RENAMED'; allowed NEW, "
        "CHANGED, DELETED)",
        id="unknown-event",
    ),
    pytest.param(
        _set("cluster.availability_zone", "us-west-2a"),
        "cluster.availability_zone: not an availability zone of the region (got 'us-west-2a';",
        id="zone-outside-region",
    ),
    pytest.param(
        _set("cluster.instance_groups.2.instance_type", "ml.p9.96xlarge"),
        "cluster.instance_groups[2].instance_type: unknown instance type (got 'ml.p9.96xlarge';",
        id="unknown-instance",
    ),
    pytest.param(
        _set("cluster.instance_groups.2.instance_type", "ml.m5.24xlarge"),
        "cluster.instance_groups[2].instance_type: has no EFA, and EFA is required",
        id="compute-without-efa",
    ),
    pytest.param(
        _set("cluster.instance_groups.2.instance_count", -2),
        "cluster.instance_groups[2].instance_count: must be at least 1 (got -2;",
        id="negative-count",
    ),
    pytest.param(
        _set("cluster.instance_groups.2.instance_count", "two"),
        "cluster.instance_groups[2].instance_count: wrong type (got 'two'; allowed an integer)",
        id="count-not-int",
    ),
    pytest.param(
        _set("cluster.instance_groups.2.name", "gpu_nodes"),
        "cluster.instance_groups[2].name: not a valid instance group name (got 'gpu_nodes';",
        id="group-name",
    ),
    pytest.param(
        _set("cluster.instance_groups.1.name", "controller"),
        "cluster.instance_groups[1].name: duplicate group name (got 'controller';",
        id="duplicate-group",
    ),
    pytest.param(
        _set("cluster.instance_groups.0.instance_count", 2),
        "cluster.instance_groups: needs exactly one controller group with instance_count 1",
        id="two-controllers",
    ),
    pytest.param(
        _set("cluster.orchestrator", "pbs"),
        "cluster.orchestrator: unknown value (got 'pbs'; allowed slurm, eks, training-job, parallelcluster)",
        id="orchestrator",
    ),
    pytest.param(
        _set("storage.lustre.storage_capacity_gb", 4800),
        "storage.lustre.storage_capacity_gb: unknown key (got 'storage_capacity_gb'; allowed storage_capacity_gib,",
        id="unknown-key",
    ),
    pytest.param(
        lambda d: d["cluster"].pop("availability_zone"),
        "cluster.availability_zone: required key is missing",
        id="missing-key",
    ),
    pytest.param(
        lambda d: d["storage"]["lustre"].update(
            efa_enabled=True, storage_capacity_gib=19200, availability_zone="us-east-2b"
        ),
        "storage.lustre.availability_zone: an EFA-enabled file system must be in the cluster's zone (got 'us-east-2b'; "
        "allowed us-east-2a)",
        id="efa-fs-other-zone",
    ),
    pytest.param(
        lambda d: d["storage"]["lustre"].update(efa_enabled=True, storage_capacity_gib=4800),
        "storage.lustre.storage_capacity_gib: must be a multiple of 19200 GiB for an EFA-enabled file system at 250 "
        "MB/s/TiB",
        id="efa-capacity",
    ),
    pytest.param(
        lambda d: (
            d["network"].update(vpc_cidr="10.0.0.0/17"),
            d["storage"]["lustre"].update(availability_zone="us-east-2b"),
        ),
        "network.vpc_cidr: too small for 2 zone(s) of one /24 public and one /18 private subnet",
        id="vpc-too-small",
    ),
    pytest.param(
        _set("network.vpc_cidr", "10.0.0.300/16"),
        "network.vpc_cidr: not an IPv4 CIDR block (got '10.0.0.300/16';",
        id="bad-cidr",
    ),
    pytest.param(
        _set("network.flow_log_retention_days", 100),
        "network.flow_log_retention_days: not a CloudWatch Logs retention (got 100;",
        id="retention",
    ),
    pytest.param(_set("region", "mars-1"), "region: not a Region name (got 'mars-1';", id="region"),
    pytest.param(
        _set(
            "network.existing_vpc",
            {
                "vpc_id": "vpc-0123456789abcdef0",
                "vpc_cidr_block": "10.1.0.0/16",
                "private_subnets": [{"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "us-east-2b"}],
            },
        ),
        "network.existing_vpc.private_subnets: no subnet in a zone the deployment uses (got ['us-east-2b']; allowed a "
        "subnet in us-east-2a)",
        id="existing-vpc-zone",
    ),
    pytest.param(
        _set("storage.data_repository.bucket_name", "My_Bucket"),
        "storage.data_repository.bucket_name: not a valid S3 bucket name (got 'My_Bucket';",
        id="bucket-name",
    ),
]


@pytest.mark.parametrize("config_path", SHIPPED_CONFIGS)
def test_shipped_configuration_loads(config_path):
    assert isinstance(load_config(ROOT / config_path), Config)


def test_default_is_slurm_on_two_p5en_in_one_zone(default_config):
    compute = [g for g in default_config.cluster.instance_groups if g.role is NodeRole.COMPUTE]
    assert default_config.cluster.orchestrator is Orchestrator.SLURM
    assert [(g.instance_type, g.instance_count) for g in compute] == [("ml.p5en.48xlarge", 2)]
    assert default_config.availability_zones == [default_config.cluster.availability_zone]


@pytest.mark.parametrize(("mutate", "expected"), INVALID)
def test_invalid_configuration_is_rejected_with_its_key(mutate, expected):
    errors = errors_for(mutate)
    assert any(line.startswith(expected) for line in errors), errors


@pytest.mark.parametrize(("mutate", "expected"), INVALID)
def test_every_error_line_has_key_got_and_allowed(mutate, expected):
    for line in errors_for(mutate):
        assert ERROR_LINE.match(line), line


def test_all_errors_are_reported_together():
    def mutate(data):
        data["storage"]["lustre"]["storage_capacity_gib"] = 1000
        data["storage"]["lustre"]["per_unit_storage_throughput_mb_s_tib"] = 300
        data["cluster"]["instance_groups"][2]["instance_type"] = "ml.nope"
        data["network"]["flow_log_retention_days"] = 2

    keys = {line.split(":")[0] for line in errors_for(mutate)}
    assert keys == {
        "storage.lustre.storage_capacity_gib",
        "storage.lustre.per_unit_storage_throughput_mb_s_tib",
        "cluster.instance_groups[2].instance_type",
        "network.flow_log_retention_days",
    }


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("region: us-east-2\ncluster: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert caught.value.errors == [f"{bad}: not valid YAML (got 'line 3'; allowed a YAML mapping)"]


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "absent.yaml")


def test_reference_docs_are_up_to_date():
    assert (ROOT / "docs/configuration.md").read_text() == reference_docs(), (
        "docs/configuration.md is stale: run `make docs`"
    )


def _config_classes():
    return [
        obj
        for obj in vars(config_module).values()
        if dataclasses.is_dataclass(obj) and obj.__module__ == config_module.__name__
    ]


@pytest.mark.parametrize("cls", _config_classes(), ids=lambda c: c.__name__)
def test_every_configuration_key_is_documented(cls):
    documented = field_docs(cls)
    assert [f.name for f in dataclasses.fields(cls) if not documented.get(f.name)] == []


def test_accounting_database_without_continuous_provisioning_is_refused():
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    data["cluster"]["accounting_database"] = {
        "endpoint": "db.example.com",
        "secret_arn": "arn:aws:secretsmanager:us-east-2:123456789012:secret:db",
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert caught.value.errors == [
        "cluster.accounting_database: an external accounting database needs continuous node "
        "provisioning (got 'standard'; allowed node_provisioning_mode continuous (and no "
        "slurm_config_strategy))"
    ]


def test_continuous_provisioning_refuses_a_slurm_config_strategy():
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    data["cluster"] |= {"node_provisioning_mode": "continuous", "slurm_config_strategy": "managed"}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert [e.split(":")[0] for e in caught.value.errors] == ["cluster.slurm_config_strategy"]


def test_a_private_subnet_too_small_for_the_nodes_interfaces_is_refused():
    # HyperPod: a Slurm P5 node takes 32 addresses (one per network card); 8 of them need 256,
    # and a /24 has 251 after AWS's 5 reserved ones.
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    compute = next(g for g in data["cluster"]["instance_groups"] if g["role"] == "compute")
    compute |= {"instance_type": "ml.p5.48xlarge", "instance_count": 8}
    data["network"] = {"private_subnet_cidr_mask": 24}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    (error,) = [e for e in caught.value.errors if e.startswith("network.private_subnet_cidr_mask")]
    assert "8 x ml.p5.48xlarge (32 each)" in error and "(got 24; allowed 23 or less (a larger subnet))" in error


def test_eks_nodes_count_the_primary_interfaces_addresses():
    from moe_cdk.core import catalog
    from moe_cdk.rules.sagemaker import node_ip_addresses

    cards = catalog.lookup("ml.p5.48xlarge").efa_interfaces
    assert (node_ip_addresses(network_cards=cards, eks=False), node_ip_addresses(network_cards=cards, eks=True)) == (
        32,
        81,
    )  # HyperPod's figures


def test_efa_file_system_without_an_efa_client_is_refused():
    # FSx for Lustre User Guide: EFA clients are Nitro v4 EFA instances other than trn2.
    data = yaml.safe_load((ROOT / "config/p5-efa-lustre.yaml").read_text())
    compute = next(g for g in data["cluster"]["instance_groups"] if g["role"] == "compute")
    compute["instance_type"] = "ml.trn2.48xlarge"
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    (error,) = [e for e in caught.value.errors if e.startswith("storage.lustre.efa_enabled")]
    assert "no compute node can use EFA to the file system" in error and "ml.trn2.48xlarge" in error


def test_efa_file_system_connection_limit_is_checked():
    data = yaml.safe_load((ROOT / "config/p5-efa-lustre.yaml").read_text())
    next(g for g in data["cluster"]["instance_groups"] if g["role"] == "compute")["instance_count"] = 129
    data["network"] = {"private_subnet_cidr_mask": 16, "vpc_cidr": "10.0.0.0/14"}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert [e for e in caught.value.errors if e.startswith("storage.lustre.efa_enabled")] == [
        "storage.lustre.efa_enabled: more EFA connections than one file system accepts (got 1032; allowed at most "
        "1024 (8 per P5-family node by default))"
    ]


def test_a_typo_in_one_section_does_not_hide_a_bad_value_in_another():
    def mutate(data):
        data["network"]["vpc_cidrr"] = "10.0.0.0/16"
        data["storage"]["lustre"]["per_unit_storage_throughput_mb_s_tib"] = 300

    errors = errors_for(mutate)
    assert [e.split(":")[0] for e in errors] == [
        "network.vpc_cidrr",
        "storage.lustre.per_unit_storage_throughput_mb_s_tib",
    ], errors


def test_a_typo_in_an_instance_group_does_not_hide_a_bad_throughput_tier():
    def mutate(data):
        data["cluster"]["instance_groups"][0]["instanc_type"] = "ml.m5.2xlarge"
        data["storage"]["lustre"]["per_unit_storage_throughput_mb_s_tib"] = 300

    errors = errors_for(mutate)
    assert [e.split(":")[0] for e in errors] == [
        "cluster.instance_groups[0].instanc_type",
        "storage.lustre.per_unit_storage_throughput_mb_s_tib",
    ], errors


TRN2 = yaml.safe_load((ROOT / "config/trn2.yaml").read_text())


def _trn2_errors(mutate) -> list[str]:
    return config_errors(TRN2, mutate)


def test_moe_train_on_trainium_is_refused_naming_the_neuron_path():
    (error,) = _trn2_errors(lambda d: d["training"].update(stack="megatron"))
    assert error.startswith("training.stack: moe-train runs megatron-core on CUDA")
    assert "use training.stack: neuronx-distributed-training" in error


def test_nxd_training_on_gpus_is_refused():
    (error,) = errors_for(lambda d: d["training"].update(stack="neuronx-distributed-training"))
    assert error.startswith("training.stack: neuronx-distributed-training runs on Trainium only")


def test_torchtitan_neuron_with_expert_parallelism_is_refused_for_its_backend():
    (error,) = _trn2_errors(lambda d: d["training"].update(stack="torchtitan-neuron"))
    assert "TorchTitan Neuron's expert-parallel backend does not run on Trn2" in error


def test_trainium_on_sagemaker_training_jobs_is_refused():
    def mutate(d):
        d["cluster"] = {
            "orchestrator": "training-job",
            "availability_zone": "us-east-2a",
            "instance_groups": [
                {"name": "trn2", "role": "compute", "instance_type": "ml.trn2.48xlarge", "instance_count": 1}
            ],
        }

    errors = _trn2_errors(mutate)
    assert any(e.startswith("cluster.orchestrator: SageMaker Training Jobs here run moe-train") for e in errors)


def test_gpu_and_trainium_groups_in_one_configuration_are_refused():
    def mutate(d):
        d["cluster"]["instance_groups"].append(
            {"name": "gpu", "role": "compute", "instance_type": "ml.p5en.48xlarge", "instance_count": 1}
        )

    errors = _trn2_errors(mutate)
    assert any(e.startswith("cluster.instance_groups: one configuration trains with one stack") for e in errors)


def test_auto_resolves_to_nxd_training_on_trainium_and_megatron_on_gpus(default_config):
    trn2 = copy.deepcopy(TRN2)
    del trn2["training"]["stack"]
    assert parse_config(trn2).training_stack is TrainingStack.NXDT
    assert default_config.training_stack is TrainingStack.MEGATRON
