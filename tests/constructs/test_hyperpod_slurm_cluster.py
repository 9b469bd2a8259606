"""HyperPodSlurmCluster: the native cluster resource, its role, its lifecycle bundle and its validation."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2, aws_ecr as ecr
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from moe_cdk.constructs.hyperpod_nodes import lifecycle_bundle_id, lifecycle_synthesizer
from moe_cdk.constructs.hyperpod_slurm_cluster import (
    NODE_EXPORTER_PORTS,
    FsxMount,
    HyperPodSlurmCluster,
    HyperPodSlurmClusterProps,
    NodeObservability,
    NodeProvisioningMode,
    NodeType,
    SlurmInstanceGroup,
    provisioning_parameters,
)
from moe_cdk.core.problems import ConfigError

ROOT = Path(__file__).resolve().parents[2]

GROUPS = (
    SlurmInstanceGroup(
        name="controller", node_type=NodeType.CONTROLLER, instance_type="ml.m5.2xlarge", instance_count=1
    ),
    SlurmInstanceGroup(
        name="gpu",
        node_type=NodeType.COMPUTE,
        instance_type="ml.p5en.48xlarge",
        instance_count=2,
        ebs_volume_size_gib=1000,
    ),
)
FSX = FsxMount(
    file_system_id="fs-0123456789abcdef0",
    availability_zone="us-east-2a",
    efa_enabled=False,
    dns_name_parameter="/moe-cdk/t/fsx/dns-name",
    mount_name_parameter="/moe-cdk/t/fsx/mount-name",
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lifecycle")
    (folder / "on_create.sh").write_text(
        "#!/usr/bin/env bash\n"
        'echo "on_create ran with $(cat "$(dirname "$0")/provisioning_parameters.json" | head -c 1)"\n'
    )
    return str(folder)


def _build(
    scripts, *, groups=GROUPS, fsx=FSX, synthesizer=True, nag=False, outdir=None, repository_name=None, **overrides
):
    app = cdk.App(outdir=outdir)
    bucket = "sagemaker-${AWS::AccountId}-us-east-2-t"
    stack = cdk.Stack(
        app,
        "T",
        env=cdk.Environment(region="us-east-2"),
        synthesizer=lifecycle_synthesizer(bucket, "bundle1") if synthesizer else None,
    )
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-east-2a"],
        private_subnet_ids=["subnet-0123456789abcdef0"],
    )
    group = ec2.SecurityGroup.from_security_group_id(stack, "Sg", "sg-0123456789abcdef0")
    if repository_name is not None:
        overrides["image_repository"] = ecr.Repository.from_repository_name(stack, "Images", repository_name)
    props = (
        dict(
            cluster_name="t",
            instance_groups=groups,
            subnet=vpc.private_subnets[0],
            security_group=group,
            lifecycle_scripts_directory=scripts,
            region="us-east-2",
            fsx=fsx,
        )
        | overrides
    )
    cluster = HyperPodSlurmCluster(stack, "Cluster", HyperPodSlurmClusterProps(**props))
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, cluster


@pytest.fixture(scope="module")
def built(scripts, tmp_path_factory):
    outdir = tmp_path_factory.mktemp("out")
    app, stack, cluster = _build(scripts, nag=True, outdir=str(outdir))
    app.synth()  # fails on any unacknowledged cdk-nag finding
    return cluster, Template.from_stack(stack), outdir


def test_slurm_orchestrator_is_managed_with_automatic_recovery(built):
    built[1].has_resource_properties(
        "AWS::SageMaker::Cluster",
        {
            "NodeRecovery": "Automatic",
            "Orchestrator": {"Slurm": {"SlurmConfigStrategy": "Managed"}},
            "VpcConfig": {"Subnets": ["subnet-0123456789abcdef0"], "SecurityGroupIds": ["sg-0123456789abcdef0"]},
        },
    )


def test_gpu_group_gets_partition_health_checks_one_thread_per_core_and_ebs(built):
    built[1].has_resource_properties(
        "AWS::SageMaker::Cluster",
        {
            "InstanceGroups": Match.array_with(
                [
                    Match.object_like(
                        {
                            "InstanceGroupName": "gpu",
                            "InstanceType": "ml.p5en.48xlarge",
                            "InstanceCount": 2,
                            "ThreadsPerCore": 1,
                            "OnStartDeepHealthChecks": ["InstanceStress", "InstanceConnectivity"],
                            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu"]},
                            "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 1000}}],
                        }
                    )
                ]
            )
        },
    )


def test_controller_has_no_partition_or_deep_health_checks(built):
    cluster = next(iter(built[1].find_resources("AWS::SageMaker::Cluster").values()))
    controller = next(g for g in cluster["Properties"]["InstanceGroups"] if g["InstanceGroupName"] == "controller")
    assert controller["SlurmConfig"] == {"NodeType": "Controller"}
    assert "OnStartDeepHealthChecks" not in controller and "ThreadsPerCore" not in controller


def test_lifecycle_runs_after_hyperpods_own_slurm_setup(built):
    # OnCreate would make the scripts install and start Slurm themselves ("Getting started with
    # SageMaker HyperPod using the AWS CLI"); the two are mutually exclusive.
    groups = next(iter(built[1].find_resources("AWS::SageMaker::Cluster").values()))["Properties"]["InstanceGroups"]
    assert all("OnInitComplete" in g["LifeCycleConfig"] and "OnCreate" not in g["LifeCycleConfig"] for g in groups)


def test_lifecycle_config_points_into_the_sagemaker_bucket(built):
    cluster, template, _ = built
    groups = next(iter(template.find_resources("AWS::SageMaker::Cluster").values()))["Properties"]["InstanceGroups"]
    life_cycle = groups[0]["LifeCycleConfig"]
    assert life_cycle["OnInitComplete"] == f"{cluster.lifecycle_entry.asset_hash}.sh"
    assert life_cycle["SourceS3Uri"] == {
        "Fn::Join": ["", ["s3://", {"Fn::Sub": "sagemaker-${AWS::AccountId}-us-east-2-t"}, "/lifecycle/bundle1/"]]
    }


def test_role_has_the_managed_instance_policy_and_no_data_access(built):
    template = built[1]
    template.has_resource_properties(
        "AWS::IAM::Role",
        {
            "ManagedPolicyArns": [
                Match.object_like(
                    {
                        "Fn::Join": [
                            "",
                            [
                                "arn:",
                                {"Ref": "AWS::Partition"},
                                ":iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy",
                            ],
                        ]
                    }
                )
            ]
        },
    )
    statements = next(iter(template.find_resources("AWS::IAM::Policy").values()))["Properties"]["PolicyDocument"][
        "Statement"
    ]
    assert not any(
        a.startswith("s3:")
        for s in statements
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    )


def test_detaching_network_interfaces_is_granted_on_every_resource(built):
    # It is authorized against the instance too, which a subnet/security-group/ENI scope never matched.
    statements = next(iter(built[1].find_resources("AWS::IAM::Policy").values()))["Properties"]["PolicyDocument"][
        "Statement"
    ]
    granting = [s for s in statements if "ec2:DetachNetworkInterface" in s["Action"]]
    assert [s["Resource"] for s in granting] == ["*"]


def test_nodes_may_read_only_the_two_fsx_parameters(built):
    statements = next(iter(built[1].find_resources("AWS::IAM::Policy").values()))["Properties"]["PolicyDocument"][
        "Statement"
    ]
    resources = [s["Resource"]["Fn::Join"][1][-1] for s in statements if s["Action"] == "ssm:GetParameter"]
    assert sorted(resources) == [":parameter/moe-cdk/t/fsx/dns-name", ":parameter/moe-cdk/t/fsx/mount-name"]


def test_provisioning_parameters_come_from_the_groups_and_the_file_system():
    parameters = provisioning_parameters(instance_groups=GROUPS, region="us-east-2", fsx=FSX)
    assert parameters["controller_group"] == "controller" and parameters["login_group"] is None
    assert parameters["worker_groups"] == [
        {
            "instance_group_name": "gpu",
            "partition_name": "gpu",
            "instance_type": "ml.p5en.48xlarge",
            "features": ["efa", "p5en", "gpu"],
        }
    ]
    assert parameters["fsx_lustre"] == {
        "dns_name_parameter": "/moe-cdk/t/fsx/dns-name",
        "mount_name_parameter": "/moe-cdk/t/fsx/mount-name",
        "mount_point": "/fsx",
        "efa_interfaces": {},
    }  # a TCP file system


def test_bundle_id_changes_with_the_scripts_or_the_parameters(scripts, tmp_path):
    parameters = provisioning_parameters(instance_groups=GROUPS, region="us-east-2", fsx=FSX)
    first = lifecycle_bundle_id(scripts, parameters)
    assert lifecycle_bundle_id(scripts, {**parameters, "region": "us-west-2"}) != first
    assert lifecycle_bundle_id(scripts, parameters) == first


def test_entry_script_unpacks_the_bundle_and_runs_on_create(built, tmp_path):
    cluster, _, outdir = built
    folder = tmp_path / "downloaded"
    folder.mkdir()
    staged_bundle = outdir / f"asset.{cluster.lifecycle_bundle.asset_hash}"
    with zipfile.ZipFile(folder / f"{cluster.lifecycle_bundle.asset_hash}.zip", "w") as bundle:
        for file in staged_bundle.iterdir():
            bundle.write(file, file.name)
    entry = folder / f"{cluster.lifecycle_entry.asset_hash}.sh"
    entry.write_bytes((outdir / f"asset.{cluster.lifecycle_entry.asset_hash}.sh").read_bytes())
    result = subprocess.run(
        ["bash", str(entry)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MOE_LC_TARGET": str(tmp_path / "target")},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "on_create ran with {"
    assert (
        json.loads((tmp_path / "target/provisioning_parameters.json").read_text())["worker_groups"][0]["partition_name"]
        == "gpu"
    )


def test_default_synthesizer_is_rejected_with_the_fix(scripts):
    with pytest.raises(ConfigError, match=r"lifecycle_scripts_directory: .*give the stack lifecycle_synthesizer"):
        _build(scripts, synthesizer=False)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="gpu", node_type=NodeType.COMPUTE, instance_type="ml.p9.48xlarge", instance_count=1
                ),
            ),
            r"instance_groups\[1\]\.instance_type: unknown instance type \(got 'ml.p9.48xlarge'",
        ),
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="cpu", node_type=NodeType.COMPUTE, instance_type="ml.m5.4xlarge", instance_count=1
                ),
            ),
            r"instance_groups\[1\]\.instance_type: has no EFA, and EFA is required",
        ),
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="gpu_nodes", node_type=NodeType.COMPUTE, instance_type="ml.p5.48xlarge", instance_count=1
                ),
            ),
            r"instance_groups\[1\]\.name: not a valid instance group name",
        ),
        ((GROUPS[1],), r"instance_groups: needs exactly one controller group"),
        ((GROUPS[0],), r"instance_groups: needs at least one compute group"),
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="gpu",
                    node_type=NodeType.COMPUTE,
                    instance_type="ml.p5.48xlarge",
                    instance_count=1,
                    ebs_volume_size_gib=0,
                ),
            ),
            r"instance_groups\[1\]\.ebs_volume_size_gib: out of range",
        ),
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="gpu",
                    node_type=NodeType.COMPUTE,
                    instance_type="ml.p5.48xlarge",
                    instance_count=1,
                    training_plan_arn="my-plan",
                ),
            ),
            r"instance_groups\[1\]\.training_plan_arn: not a SageMaker training plan ARN \(got 'my-plan'",
        ),
        (
            (
                GROUPS[0],
                SlurmInstanceGroup(
                    name="gpu",
                    node_type=NodeType.COMPUTE,
                    instance_type="ml.p5.48xlarge",
                    instance_count=1,
                    training_plan_arn="arn:aws:sagemaker:us-east-2:123456789012:cluster/abcdefghijkl",
                ),
            ),
            r"instance_groups\[1\]\.training_plan_arn: not a SageMaker training plan ARN",
        ),
    ],
)
def test_invalid_groups_are_rejected_by_key(scripts, groups, message):
    with pytest.raises(ConfigError, match=message):
        _build(scripts, groups=groups)


def test_efa_file_system_in_another_zone_is_rejected(scripts):
    fsx = FsxMount(
        file_system_id="fs-1",
        availability_zone="us-east-2b",
        efa_enabled=True,
        dns_name_parameter="/a",
        mount_name_parameter="/b",
    )
    with pytest.raises(
        ConfigError,
        match=r"fsx.availability_zone: an EFA-enabled file system must be in the cluster's zone \(got 'us-east-2b'; "
        r"allowed us-east-2a\)",
    ):
        _build(scripts, fsx=fsx)


def test_bad_accounting_database_is_reported_by_prop(scripts):
    from moe_cdk.constructs.hyperpod_slurm_cluster import AccountingDatabase

    with pytest.raises(ConfigError) as error:
        _build(
            scripts,
            node_provisioning_mode=NodeProvisioningMode.CONTINUOUS,
            accounting_database=AccountingDatabase(endpoint="db_1", secret_arn="nope", port=0, name="no-dash"),
        )
    assert [p.split(":")[0] for p in error.value.errors] == [
        "accounting_database.secret_arn",
        "accounting_database.port",
        "accounting_database.name",
        "accounting_database.endpoint",
    ]


def test_accounting_database_needs_continuous_provisioning(scripts):
    from moe_cdk.constructs.hyperpod_slurm_cluster import AccountingDatabase

    database = AccountingDatabase(
        endpoint="db.example.com", secret_arn="arn:aws:secretsmanager:us-east-2:123456789012:secret:db"
    )
    with pytest.raises(
        ConfigError,
        match=r"accounting_database: an external accounting database needs continuous node "
        r"provisioning \(got 'standard'",
    ):
        _build(scripts, accounting_database=database)


def test_continuous_provisioning_omits_the_slurm_config_strategy(scripts):
    _, stack, _ = _build(scripts, node_provisioning_mode=NodeProvisioningMode.CONTINUOUS)
    (cluster,) = Template.from_stack(stack).find_resources("AWS::SageMaker::Cluster").values()
    assert (cluster["Properties"]["NodeProvisioningMode"], cluster["Properties"]["Orchestrator"]) == (
        "Continuous",
        {"Slurm": {}},
    )


def test_a_training_plan_arn_of_the_apis_shape_reaches_the_group(scripts):
    arn = "arn:aws:sagemaker:us-east-2:123456789012:training-plan/moe-plan"
    groups = (
        GROUPS[0],
        SlurmInstanceGroup(
            name="gpu",
            node_type=NodeType.COMPUTE,
            instance_type="ml.p5.48xlarge",
            instance_count=1,
            training_plan_arn=arn,
        ),
    )
    _, stack, _ = _build(scripts, groups=groups)
    Template.from_stack(stack).has_resource_properties(
        "AWS::SageMaker::Cluster",
        {"InstanceGroups": Match.array_with([Match.object_like({"InstanceGroupName": "gpu", "TrainingPlanArn": arn})])},
    )


def test_nodes_may_pull_the_training_image(scripts, tmp_path):
    app, stack, _ = _build(scripts, nag=True, outdir=str(tmp_path), repository_name="cdk-assets-images")
    app.synth()  # the role's new '*' action is covered by its acknowledgment
    statements = [
        st
        for p in Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    pull = next(st for st in statements if "ecr:BatchGetImage" in st["Action"])
    assert pull["Action"] == ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    assert "cdk-assets-images" in json.dumps(pull["Resource"])
    assert any("ecr:GetAuthorizationToken" in st["Action"] and st["Resource"] == "*" for st in statements)


def test_efa_file_system_tells_p5_groups_how_many_efa_interfaces_to_use():
    fsx = FsxMount(
        file_system_id="fs-1",
        availability_zone="us-east-2a",
        efa_enabled=True,
        dns_name_parameter="/a",
        mount_name_parameter="/b",
    )
    groups = (
        *GROUPS,
        SlurmInstanceGroup(name="old", node_type=NodeType.COMPUTE, instance_type="ml.p4de.24xlarge", instance_count=1),
    )
    parameters = provisioning_parameters(instance_groups=groups, region="us-east-2", fsx=fsx)
    assert parameters["fsx_lustre"]["efa_interfaces"] == {g.name: 8 for g in GROUPS if g.node_type is NodeType.COMPUTE}


def test_observability_props_are_checked_as_the_nodes_check_them(scripts):
    bad = NodeObservability(remote_write_url_parameter="no-slash", scrape_interval_s=10, trainer_metrics_port=9100)
    with pytest.raises(ConfigError) as error:
        _build(scripts, observability=bad)
    assert error.value.errors == [
        "observability.remote_write_url_parameter: not an SSM parameter path (got 'no-slash'; allowed /a/b/c)",
        "observability.scrape_interval_s: out of range (got 10; allowed 30 to 300)",
        "observability.trainer_metrics_port: not a port the trainer can serve on next to the exporters "
        "(got 9100; allowed 1024 to 65535 except 9100, 9109, 9400, or null)",
    ]


def test_observability_lets_the_nodes_read_the_url_and_pull_the_exporters(scripts):
    observability = NodeObservability(remote_write_url_parameter="/t/remote-write", trainer_metrics_port=9410)
    app, stack, cluster = _build(scripts, observability=observability, nag=True)
    app.synth()  # the exporter pull's wildcard is acknowledged
    assert cluster.provisioning_parameters["observability"] == {
        "remote_write_url_parameter": "/t/remote-write",
        "scrape_interval_s": 30,
        "trainer_metrics_port": 9410,
    }
    template = Template.from_stack(stack)
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    resources = json.dumps(statements)
    assert "parameter/t/remote-write" in resources and "602401143452:repository/hyperpod/*" in resources


def test_the_exporter_ports_are_the_ones_the_nodes_refuse_for_the_trainer():
    # node_info.py runs on the nodes outside the package, so it holds its own copy of the list.
    spec = importlib.util.spec_from_file_location("node_info", ROOT / "lifecycle_scripts/node_info.py")
    node_info = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(node_info)
    assert tuple(node_info.EXPORTER_PORTS) == NODE_EXPORTER_PORTS


def test_synthesis_leaves_nothing_in_the_temporary_directory(scripts, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    app, _, _ = _build(scripts, outdir=str(tmp_path / "out"))
    assembly = app.synth()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert [a for a in Path(assembly.directory).glob("asset.*") if (a / "on_create.sh").exists()]


def test_the_construct_refuses_a_minimum_in_standard_provisioning_and_emits_it_in_continuous(scripts):
    groups = (GROUPS[0], dataclasses.replace(GROUPS[1], min_instance_count=1))
    with pytest.raises(ConfigError, match=r"instance_groups\[1\]\.min_instance_count: needs continuous node"):
        _build(scripts, groups=groups)
    _, stack, _ = _build(scripts, groups=groups, node_provisioning_mode=NodeProvisioningMode.CONTINUOUS)
    Template.from_stack(stack).has_resource_properties(
        "AWS::SageMaker::Cluster",
        {"InstanceGroups": Match.array_with([Match.object_like({"InstanceGroupName": "gpu", "MinInstanceCount": 1})])},
    )
