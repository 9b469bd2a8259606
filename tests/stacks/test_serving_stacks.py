"""``serving`` on a HyperPod EKS configuration: the inference operator's add-on after what it needs, its roles as AWS's
chart and managed policy require them, least privilege for the rest, and the refusals by key. The shipped
config/eks-p5en.yaml serves; tests/stacks/test_stacks.py runs it through the CDK CLI, cdk-nag and cfn-lint."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, resources_of_type, synth

from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import parse_config

EKS = ROOT / "config/eks-p5en.yaml"


def _data(**changes) -> dict:
    data = yaml.safe_load(EKS.read_text())
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, dict]:
    return synth(parse_config(_data()), tmp_path_factory.mktemp("cdk.out"))


def _one(template: dict, kind: str, needle: str) -> tuple[str, dict]:
    [(name, resource)] = [(k, r) for k, r in resources_of_type(template, kind).items() if needle in k]
    return name, resource


def _addons(template: dict) -> dict[str, tuple[str, dict]]:
    return {r["Properties"]["AddonName"]: (k, r) for k, r in resources_of_type(template, "AWS::EKS::Addon").items()}


def test_the_inference_addon_comes_after_the_addons_it_needs_and_the_hyperpod_cluster(templates):
    addons = _addons(templates["moe-eks-cluster"])
    _, inference = addons["amazon-sagemaker-hyperpod-inference"]
    cluster, _ = _one(templates["moe-eks-cluster"], "AWS::SageMaker::Cluster", "Cluster")
    needed = {addons[name][0] for name in ("aws-mountpoint-s3-csi-driver", "metrics-server")} | {cluster}
    assert needed <= set(inference["DependsOn"])


def test_cert_manager_and_the_fsx_driver_get_the_operators_minimum_builds(templates):
    versions = {name: r["Properties"].get("AddonVersion") for name, (_, r) in _addons(templates["moe-eks-eks"]).items()}
    assert (versions["cert-manager"], versions["aws-fsx-csi-driver"]) == ("v1.18.2-eksbuild.2", "v1.6.0-eksbuild.1")


def test_the_addon_names_its_roles_bucket_and_cluster(templates):
    _, inference = _addons(templates["moe-eks-cluster"])["amazon-sagemaker-hyperpod-inference"]
    text = json.dumps(inference["Properties"]["ConfigurationValues"])
    for key in ("executionRoleArn", "tlsCertificateS3Bucket", "hyperpodClusterArn", "alb", "keda", "irsa"):
        assert f'\\"{key}\\"' in text, key
    assert "hyperpod-tls-moe-eks-" in text


def _subject(template: dict, role: dict) -> dict:
    """The OIDC condition of a role's trust policy: the CfnJson value it points to."""
    [statement] = [
        s for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"] if "Federated" in s["Principal"]
    ]
    custom = statement["Condition"]["StringEquals"]["Fn::GetAtt"][0]
    value = json.dumps(template["Resources"][custom]["Properties"]["Value"])
    return value


def test_the_execution_role_is_named_and_trusted_as_the_chart_and_managed_policy_require(templates):
    template = templates["moe-eks-cluster"]
    _, role = _one(template, "AWS::IAM::Role", "InferenceExecutionRole")
    assert role["Properties"]["RoleName"].startswith("SageMakerHyperPodInference")
    assert "AmazonSageMakerHyperPodInferenceAccess" in json.dumps(role["Properties"]["ManagedPolicyArns"])
    services = [s["Principal"].get("Service") for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]]
    assert "sagemaker.amazonaws.com" in services
    assert "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager" in _subject(
        template, role
    )


def test_the_s3_driver_reads_only_the_model_prefixes_of_the_data_bucket(templates):
    template = templates["moe-eks-cluster"]
    _, policy = _one(template, "AWS::IAM::Policy", "InferenceS3CsiRole")
    statements = {s["Action"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(statements) == {"s3:ListBucket", "s3:GetObject"}
    assert statements["s3:ListBucket"]["Condition"] == {"StringLike": {"s3:prefix": ["checkpoints/*"]}}
    assert json.dumps(statements["s3:GetObject"]["Resource"]).endswith('-us-east-2-moe-eks/checkpoints/*"]]}')


def test_the_load_balancer_controller_writes_only_what_carries_its_cluster_tag(templates):
    _, policy = _one(templates["moe-eks-cluster"], "AWS::IAM::Policy", "InferenceLoadBalancerControllerRole")
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        deletes = [a for a in actions if "Delete" in a and "Listener" not in a and "Rule" not in a]
        if deletes:
            assert "elbv2.k8s.aws/cluster" in json.dumps(statement["Condition"]), statement


def test_public_subnets_are_tagged_for_internet_facing_load_balancers(templates):
    # The AWS Load Balancer Controller puts internet-facing load balancers in the public subnets tagged so (its
    # subnet auto-discovery); aws_eks_v2's cluster tags every public subnet of its VPC.
    subnets = resources_of_type(templates["moe-eks-network"], "AWS::EC2::Subnet")
    public = [r for k, r in subnets.items() if "Public" in k]
    assert public and all({"Key": "kubernetes.io/role/elb", "Value": "1"} in r["Properties"]["Tags"] for r in public)


def test_the_tls_bucket_is_encrypted_private_tls_only_logged_and_kept(templates):
    template = templates["moe-eks-storage"]
    name, bucket = _one(template, "AWS::S3::Bucket", "TlsBucket")
    props = bucket["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert all(props["PublicAccessBlockConfiguration"].values())
    assert props["LoggingConfiguration"]["LogFilePrefix"] == "tls-bucket/"
    assert bucket["DeletionPolicy"] == "Retain"
    [policy] = [
        p
        for p in resources_of_type(template, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": name}
    ]
    assert '"aws:SecureTransport": "false"' in json.dumps(policy["Properties"]["PolicyDocument"])


def test_a_configuration_without_serving_has_no_operator(tmp_path):
    data = _data()
    data.pop("serving")
    templates = synth(parse_config(data), tmp_path)
    assert "amazon-sagemaker-hyperpod-inference" not in _addons(templates["moe-eks-cluster"])
    assert not [k for k in resources_of_type(templates["moe-eks-storage"], "AWS::S3::Bucket") if "TlsBucket" in k]


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (
            lambda d: yaml.safe_load((ROOT / "config/default.yaml").read_text()) | {"serving": {}},
            "serving",
            "the inference operator serves on HyperPod EKS clusters",
        ),
        (
            lambda d: d | {"serving": {"execution_role_name": "InferenceRole"}},
            "serving.execution_role_name",
            "accept only",
        ),
        (lambda d: d | {"serving": {"tls_bucket_name": "my-certs"}}, "serving.tls_bucket_name", "hyperpod-tls"),
        (
            lambda d: d | {"eks": {**d["eks"], "addon_versions": {"cert-manager": "v1.17.1-eksbuild.1"}}},
            "eks.addon_versions.cert-manager",
            "below the version the inference operator needs",
        ),
        (
            lambda d: d | {"name": "a-very-long-cluster-name", "region": "ap-southeast-3"},
            "serving.tls_bucket_name",
            "would have",
        ),
    ],
    ids=["slurm", "role-name", "bucket-name", "old-cert-manager", "long-default-name"],
)
def test_what_cannot_serve_is_refused_by_key(change, key, message):
    with pytest.raises(ConfigError) as error:
        parse_config(change(_data()))
    assert any(p.key == key and message in p.message for p in error.value.problems), error.value.problems


def test_serving_in_an_adopted_vpc_is_refused_for_its_missing_public_subnets():
    data = _data()
    data["network"] = {
        "existing_vpc": {
            "vpc_id": "vpc-0123456789abcdef0",
            "vpc_cidr_block": "10.0.0.0/16",
            "private_subnets": [
                {"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "us-east-2a"},
                {"subnet_id": "subnet-0123456789abcdef1", "availability_zone": "us-east-2b"},
            ],
        }
    }
    with pytest.raises(ConfigError, match=r"serving: the endpoints' load balancer needs public subnets"):
        parse_config(data)


def test_the_hybrid_serving_cluster_reads_the_training_deployments_bucket(tmp_path):
    templates = synth(parse_config(yaml.safe_load((ROOT / "config/hybrid-serve-eks.yaml").read_text())), tmp_path)
    _, policy = _one(templates["moe-serve-cluster"], "AWS::IAM::Policy", "InferenceS3CsiRole")
    grants = json.dumps(policy["Properties"]["PolicyDocument"]["Statement"])
    assert "-us-east-2-moe-train/checkpoints/*" in grants and "moe-serve" not in grants
