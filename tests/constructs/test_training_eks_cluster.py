"""TrainingEksCluster: the control plane's security properties (cdk-nag's EKS rules skip
aws_eks_v2, so these assert them instead), the add-ons, and the device plugins' scheduling."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks
from conftest import STANDIN_CHART, resources_of_type

from moe_cdk.constructs.training_eks_cluster import EndpointAccess, TrainingEksCluster, TrainingEksClusterProps
from moe_cdk.core.problems import ConfigError
from moe_cdk.rules import eks as eks_rules

TYPES = ("ml.m5.2xlarge", "ml.p5en.48xlarge", "ml.p4de.24xlarge", "ml.trn2.48xlarge")


def _build(*, nag=False, **overrides):
    app = cdk.App()
    stack = cdk.Stack(app, "T", env=cdk.Environment(region="us-east-2"))
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["us-east-2a", "us-east-2b"], nat_gateways=1)
    vpc.add_flow_log("FlowLog")
    nodes = ec2.SecurityGroup(stack, "Nodes", vpc=vpc)
    props = (
        dict(
            cluster_name="t",
            vpc=vpc,
            subnets=vpc.private_subnets,
            node_security_group=nodes,
            instance_types=TYPES,
            hyperpod_chart_directory=str(STANDIN_CHART),
        )
        | overrides
    )
    cluster = TrainingEksCluster(stack, "Eks", TrainingEksClusterProps(**props))
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, cluster


@pytest.fixture(scope="module")
def built():
    app, stack, cluster = _build(nag=True)
    app.synth()  # fails on any unacknowledged cdk-nag finding
    return cluster, Template.from_stack(stack)


def _eks(template: Template) -> dict:
    (cluster,) = template.find_resources("AWS::EKS::Cluster").values()
    return cluster["Properties"]


def _chart_values(template: Template, chart: str) -> dict:
    charts = [
        r["Properties"]
        for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"].get("Chart") == chart
    ]
    assert len(charts) == 1, f"{chart}: {len(charts)} releases"
    return json.loads(charts[0]["Values"])


def test_api_endpoint_is_private_by_default(built):
    vpc_config = _eks(built[1])["ResourcesVpcConfig"]
    assert (vpc_config["EndpointPrivateAccess"], vpc_config["EndpointPublicAccess"]) == (True, False)


def test_public_endpoint_is_limited_to_the_given_ranges():
    _, stack, _ = _build(endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE, public_access_cidrs=["203.0.113.0/24"])
    vpc_config = _eks(Template.from_stack(stack))["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24"]


def test_every_control_plane_log_type_is_on(built):
    types = {t["Type"] for t in _eks(built[1])["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert types == {"api", "audit", "authenticator", "controllerManager", "scheduler"}


def test_secrets_are_encrypted_with_a_rotating_key(built):
    encryption = _eks(built[1])["EncryptionConfig"]
    assert encryption[0]["Resources"] == ["secrets"]
    key_id = encryption[0]["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert built[1].to_json()["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True


def test_authentication_mode_and_version_are_ones_hyperpod_supports(built):
    eks = _eks(built[1])
    assert eks["AccessConfig"]["AuthenticationMode"] in ("API", "API_AND_CONFIG_MAP")
    assert eks["Version"] in eks_rules.KUBERNETES_VERSIONS


def test_no_auto_mode_and_no_node_group(built):
    assert _eks(built[1])["ComputeConfig"]["Enabled"] is False
    assert not built[1].find_resources("AWS::EKS::Nodegroup")


def test_control_plane_sits_in_the_given_private_subnets(built):
    subnets = _eks(built[1])["ResourcesVpcConfig"]["SubnetIds"]
    assert all("Private" in s["Ref"] for s in subnets) and len(subnets) == 2


def test_required_addons_are_installed(built):
    names = {r["Properties"]["AddonName"] for r in built[1].find_resources("AWS::EKS::Addon").values()}
    assert names == {a.name for a in eks_rules.ADDONS}


def test_addon_versions_can_be_pinned():
    _, stack, _ = _build(addon_versions={"vpc-cni": "v1.19.2-eksbuild.1"})
    Template.from_stack(stack).has_resource_properties(
        "AWS::EKS::Addon", {"AddonName": "vpc-cni", "AddonVersion": "v1.19.2-eksbuild.1"}
    )


def test_container_insights_is_an_option_with_its_own_role():
    _, stack, _ = _build(container_insights=True)
    Template.from_stack(stack).has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "amazon-cloudwatch-observability",
            "PodIdentityAssociations": [Match.object_like({"ServiceAccount": "cloudwatch-agent"})],
        },
    )


def test_efa_plugin_runs_on_exactly_the_configured_efa_types(built):
    values = _chart_values(built[1], "aws-efa-k8s-device-plugin")
    assert values["supportedInstanceLabels"] == {
        "keys": ["node.kubernetes.io/instance-type"],
        "values": ["ml.p4de.24xlarge", "ml.p5en.48xlarge", "ml.trn2.48xlarge"],
    }


def test_nvidia_plugin_runs_on_exactly_the_gpu_types(built):
    values = _chart_values(built[1], "nvidia-device-plugin")
    (term,) = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["ml.p4de.24xlarge", "ml.p5en.48xlarge"]


def test_neuron_plugin_only_with_trainium_groups():
    _, stack, _ = _build(instance_types=("ml.m5.2xlarge", "ml.p5en.48xlarge"))
    charts = {
        r["Properties"]["Release"]
        for r in resources_of_type(Template.from_stack(stack).to_json(), "Custom::AWSCDK-EKS-HelmChart").values()
    }
    assert charts == {
        "nvidia-device-plugin",
        "aws-efa-k8s-device-plugin",
        "dcgm-exporter",
        "prometheus-node-exporter",
        "hyperpod-dependencies",
    }


def test_charts_are_pinned_to_the_catalog_versions(built):
    for r in built[1].find_resources("Custom::AWSCDK-EKS-HelmChart").values():
        if "ChartAssetURL" in r["Properties"]:  # the HyperPod chart, pinned by commit (make hyperpod-chart)
            continue
        chart = next(c for c in eks_rules.CHARTS if c.chart == r["Properties"]["Chart"])
        assert (r["Properties"]["Version"], r["Properties"]["Repository"]) == (chart.version, chart.repository)


def test_hyperpod_chart_is_staged_as_an_asset(tmp_path):
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: hyperpod-helm-chart\nversion: 0.1.0\n")
    _, stack, _ = _build(hyperpod_chart_directory=str(tmp_path))
    (release,) = [
        r["Properties"]
        for r in resources_of_type(Template.from_stack(stack).to_json(), "Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Release"] == "hyperpod-dependencies"
    ]
    assert "ChartAssetURL" in release
    assert json.loads(release["Values"]) == eks_rules.HYPERPOD_CHART_VALUES


def test_missing_hyperpod_chart_is_a_synth_error(tmp_path):
    with pytest.raises(ConfigError) as error:
        _build(hyperpod_chart_directory=str(tmp_path / "not-staged"))
    (message,) = error.value.errors
    assert message.startswith(
        "hyperpod_chart_directory: has no Chart.yaml: AWS's HyperPod dependencies chart is not staged"
    )
    assert "make hyperpod-chart" in message


def test_nodes_and_control_plane_can_reach_each_other(built):
    rules = built[1].find_resources("AWS::EC2::SecurityGroupIngress")
    assert {(r["Properties"]["IpProtocol"], r["Properties"].get("FromPort")) for r in rules.values()} >= {
        ("tcp", 443),
        ("-1", None),
    }


def test_bad_props_are_all_reported():
    with pytest.raises(ConfigError) as error:
        _build(
            endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE,
            public_access_cidrs=["0.0.0.0/0", "nope"],
            kubernetes_version="1.20",
            addon_versions={"bogus": "1"},
            instance_types=("ml.x9.huge",),
            neuron_resource="aws.amazon.com/neuroncore",
        )
    problems = error.value.errors
    assert [p.split(":")[0] for p in problems] == [
        "public_access_cidrs[0]",
        "public_access_cidrs[1]",
        "addon_versions.bogus",
        "kubernetes_version",
        "instance_types[0]",
        "neuron_resource",
    ]
    assert "opens the API to the internet" in problems[0]


def test_admin_roles_get_cluster_admin_access_entries():
    role = "arn:aws:iam::123456789012:role/platform-admins"
    _, stack, _ = _build(admin_role_arns=[role])
    entries = Template.from_stack(stack).find_resources("AWS::EKS::AccessEntry")
    (entry,) = [e["Properties"] for e in entries.values() if e["Properties"]["PrincipalArn"] == role]
    (policy,) = entry["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])
