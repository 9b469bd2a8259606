"""The architecture diagram drawn from a synthesized default app (tools/diagram.py).

The diagram is a ``graphviz.Digraph``; these tests read the facts (nodes, labels, edges, clusters) from its DOT
source, ``architecture_dot`` = ``.source``, where the graphviz package quotes an ID only when it has to."""

from __future__ import annotations

import re
import shutil

import graphviz
import pytest
from conftest import ROOT, synth

from moe_cdk.cli.diagram import main
from moe_cdk.schema.config import load_config
from moe_cdk.tools.diagram import (
    Diagram,
    Index,
    Node,
    Stack,
    architecture_dot,
    architecture_graph,
    render_png,
    to_graph,
)


@pytest.fixture(scope="module")
def cdk_out(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("diagram-cdk.out")
    synth(load_config(ROOT / "config/default.yaml"), outdir)
    return outdir


@pytest.fixture(scope="module")
def dot(cdk_out) -> str:
    return architecture_dot(cdk_out)


# A DOT ID as the graphviz package writes it: quoted only when it has to be (an HTML label is not one).
ID = r'(?:"((?:[^"\\]|\\.)*)"|(?!(?:graph|node|edge) )([^\s"<\[\]]+))'


def labels(dot: str) -> dict[str, str]:
    """Node id -> label (with real newlines)."""
    return {
        (m.group(1) or m.group(2)): (m.group(3) or m.group(4) or "").replace("\\n", "\n").replace("\\l", "\n")
        for m in re.finditer(rf"^\s*{ID} \[label={ID}", dot, re.M)
    }


def edges(dot: str) -> set[tuple[str, str, str]]:
    """(tail label first line, head label first line, edge label) for every edge."""
    first = {node: label.split("\n")[0] for node, label in labels(dot).items()}
    found = set()
    for m in re.finditer(rf"^\s*{ID} -> {ID}(?: \[([^\n]*)\])?;?$", dot, re.M):
        edge_label = re.search(rf"label={ID}", m.group(5) or "")
        text = (edge_label.group(1) or edge_label.group(2) or "").replace("\\n", " ") if edge_label else ""
        found.add((first[m.group(1) or m.group(2)], first[m.group(3) or m.group(4)], text))
    return found


def test_one_cluster_per_stack(dot):
    for stack in ("moe-network", "moe-storage", "moe-cluster"):
        assert re.search(rf'subgraph "?cluster_{stack.replace("-", "_")}"? {{', dot)
        assert re.search(rf'label="{stack} \(\d+ resources\)', dot)
    assert "configuration 'moe', region us-east-2" in dot


def test_labels_come_from_template_properties(dot):
    text = "\n".join(labels(dot).values())
    for expected in (
        "FSx for Lustre PERSISTENT_2 4800 GiB, 250 MB/s/TiB",
        "gpu 2× ml.p5en.48xlarge",
        "controller 1× ml.m5.2xlarge",
        "login 1× ml.m5.2xlarge",
        "/datasets ← datasets",
        "/checkpoints ↔ checkpoints",
        "Private subnet us-east-2a (/18)",
        "Interface endpoints ×7",
        "sagemaker.api",
        "ecr.dkr",
        "ssmmessages",
        "EFA security group",
        "S3 data bucket",
        "Lifecycle bucket",
        "S3 access-log bucket",
        "SSM parameters ×2",
        "Training image (ECR asset)",
        "KMS key",
    ):
        assert expected in text, expected
    assert "VPC 10.0.0.0/16" in dot


def test_supporting_resources_are_not_drawn(dot):
    text = "\n".join(labels(dot).values())
    for hidden in ("RouteTable", "BucketPolicy", "Lambda", "Custom::", "EIP"):
        assert hidden not in text


def test_data_flow_and_network_edges(dot):
    found = edges(dot)
    firsts = {(tail, head) for tail, head, _ in found}
    cluster = "HyperPod cluster moe (Slurm)"
    fsx = "FSx for Lustre PERSISTENT_2 4800 GiB, 250 MB/s/TiB"
    assert (cluster, fsx, "Lustre mount TCP 988, 1018-1023") in found
    assert (fsx, "Data repository associations:") in firsts
    assert ("Data repository associations:", "S3 data bucket", "import/export") in found
    assert ("Lifecycle bucket", cluster, "lifecycle scripts") in found
    assert ("Training image (ECR asset)", cluster, "training image") in found
    assert (cluster, "EFA security group") in firsts
    assert (cluster, "Private subnet us-east-2a (/18)", "ENIs in") in found
    assert ("Private subnet us-east-2a (/18)", "NAT gateway", "0.0.0.0/0") in found
    assert ("NAT gateway", "Public subnet us-east-2a (/24)") in firsts
    assert ("Public subnet us-east-2a (/24)", "Internet gateway", "0.0.0.0/0") in found
    assert ("Internet gateway", "Internet") in firsts


@pytest.fixture(scope="module")
def eks_dot(tmp_path_factory) -> str:
    outdir = tmp_path_factory.mktemp("diagram-eks")
    synth(load_config(ROOT / "config/eks-p5en.yaml"), outdir)
    return architecture_dot(outdir)


def test_the_eks_stack_is_connected_to_the_cluster_its_nodes_join(eks_dot):
    found = edges(eks_dot)
    eks = "EKS cluster moe-eks, Kubernetes 1.32"
    assert ("HyperPod cluster moe-eks (Eks)", eks, "nodes join") in found
    assert (eks, "Private subnets ×2", "control plane ENIs in") in found
    assert (eks, "EKS add-ons ×11", "installs") in found  # 7 of its own, the training operator, 3 for serving
    assert ("EKS access entry: AmazonEKSClusterAdminPolicy", eks, "may use") in found
    assert (eks, "Managed scraper, every 30s", "scrapes pods") in found
    assert ("Managed scraper, every 30s", "Managed Prometheus workspace moe-eks-training", "remote write") in found
    assert (
        "Managed Prometheus workspace moe-eks-training",
        "Managed Grafana moe-eks-training, 10.4",
        "queries",
    ) in found
    assert ("Alert rules: 7 alerts", "Managed Prometheus workspace moe-eks-training", "evaluated in") in found


def test_every_eks_stack_resource_drawn_has_a_label_of_its_own(eks_dot):
    generic = [label for label in labels(eks_dot).values() if re.search(r"\((AWS::EKS|AWS::APS|AWS::Grafana)::", label)]
    assert generic == [] and "LayerVersion" not in eks_dot and "kubectl-ready" not in eks_dot


def test_deterministic(cdk_out, dot):
    assert architecture_dot(cdk_out) == dot


def test_committed_diagram_matches_the_default_config(dot):
    committed = ROOT / "docs/architecture.dot"
    assert committed.is_file(), "docs/architecture.dot is missing; run: make diagram"
    assert committed.read_text() == dot, "docs/architecture.dot is out of date; run: make diagram"


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed (make test installs it)")
def test_renders_png(dot, tmp_path):
    out = tmp_path / "architecture.png"
    render_png(dot, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_writes_both_files(cdk_out, tmp_path, capsys):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz `dot` is not installed")
    png, dot_file = tmp_path / "a.png", tmp_path / "a.dot"
    assert main(["--cdk-out", str(cdk_out), "--output", str(png), "--dot", str(dot_file)]) == 0
    assert png.is_file() and dot_file.read_text() == architecture_dot(cdk_out)
    assert str(png) in capsys.readouterr().out


def test_missing_cdk_out_exits_2(tmp_path, capsys):
    assert main(["--cdk-out", str(tmp_path / "cdk.out"), "--output", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "moe-cdk diagram: 1 problem(s)",
        f"  --cdk-out: no synthesized app (got '{tmp_path / 'cdk.out'}'; allowed a folder written by make synth)",
    ]


def test_missing_dot_exits_2(cdk_out, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["--cdk-out", str(cdk_out), "--output", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "`dot`" in err and "apt-get install graphviz" in err


def test_the_dot_source_is_the_graphviz_graph(cdk_out, dot):
    graph = architecture_graph(cdk_out)
    assert isinstance(graph, graphviz.Digraph) and graph.source == dot


def test_a_conditional_value_reads_as_its_branches():
    ix = Index([Stack("s", "us-east-2", {"Resources": {"Role": {"Type": "AWS::IAM::Role"}}}, {})])
    optional = {"Fn::If": ["HasEcr", "arn:aws:iam::aws:policy/Ecr", {"Ref": "AWS::NoValue"}]}
    assert ix.text("s", optional) == "arn:aws:iam::aws:policy/Ecr (if HasEcr)"
    assert ix.text("s", {"Fn::If": ["Big", "p5en", "p4de"]}) == "p5en | p4de"
    assert ix.resolve("s", {"Fn::If": ["C", {"Ref": "Role"}, "x"]})[1] == [("s", "Role")]


def test_index_follows_references_within_and_across_stacks():
    """Ref, Fn::GetAtt and Fn::Sub within a stack; Fn::ImportValue (an export name spelled with Fn::Join on one side
    and Fn::Sub on the other) and Fn::GetStackOutput across stacks."""
    network = Stack(
        "net",
        "us-east-2",
        {
            "Resources": {
                "Vpc": {"Type": "AWS::EC2::VPC"},
                "Group": {"Type": "AWS::EC2::SecurityGroup", "Properties": {"VpcId": {"Ref": "Vpc"}}},
            },
            "Outputs": {
                "GroupId": {
                    "Value": {"Fn::GetAtt": ["Group", "GroupId"]},
                    "Export": {"Name": {"Fn::Join": ["", ["net-", {"Ref": "AWS::Region"}]]}},
                },
                "VpcId": {"Value": {"Ref": "Vpc"}},
            },
        },
        {},
    )
    storage = Stack(
        "storage",
        "us-east-2",
        {
            "Resources": {
                "Key": {"Type": "AWS::KMS::Key"},
                "Fs": {
                    "Type": "AWS::FSx::FileSystem",
                    "Properties": {
                        "SecurityGroupIds": [{"Fn::ImportValue": {"Fn::Sub": "net-${AWS::Region}"}}],
                        "SubnetIds": [{"Fn::GetStackOutput": {"StackName": "net", "OutputName": "VpcId"}}],
                        "Tags": [{"Key": "Name", "Value": {"Fn::Sub": "${Key.Arn}-fs"}}],
                        "KmsKeyId": {"Ref": "Key"},
                    },
                },
            }
        },
        {},
    )
    ix = Index([network, storage])
    fs = ix.resources[("storage", "Fs")]
    assert fs.refs["SecurityGroupIds"] == [("net", "Group")]
    assert fs.refs["SubnetIds"] == [("net", "Vpc")]
    assert fs.refs["Tags.Value"] == [("storage", "Key")]
    assert fs.refs[""] == [("net", "Group"), ("net", "Vpc"), ("storage", "Key")]
    assert [r.key for r in ix.linked(("net", "Group"), "AWS::FSx::FileSystem", "SecurityGroupIds")] == [fs.key]
    assert ix.linked(("net", "Group"), "AWS::FSx::FileSystem", "SubnetIds") == []
    uri = {"Fn::Sub": ["s3://${Bucket}/scripts", {"Bucket": {"Fn::ImportValue": "net-${AWS::Region}"}}]}
    assert ix.text("storage", uri) == "s3://${Group.GroupId}/scripts"


def test_labels_are_quoted_by_graphviz():
    diagram = Diagram('a "title"', vpcs={}, rules={})
    diagram.nodes["n"] = Node("n", "other", label='say "hi" \\ twice\nsecond line')
    source = to_graph([], diagram).source
    assert 'label="say \\"hi\\" \\\\ twice\\nsecond line"' in source
    if shutil.which("dot") is not None:
        graphviz.Source(source).pipe(format="canon")  # valid DOT
