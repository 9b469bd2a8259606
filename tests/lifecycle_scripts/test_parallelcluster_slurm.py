"""ParallelCluster's custom actions on a real Slurm laid out as ParallelCluster lays out a cluster, and the job that
``moe-cdk slurm render`` writes for config/parallelcluster.yaml run on it.

ParallelCluster's layout: Slurm under /opt/slurm, whose etc folder the head node shares with every node (not
configless: each slurmd reads the same slurm.conf and plugstack.conf); pyxis built into /usr/local by its AMI but not
registered, its configuration left under /opt/parallelcluster/examples (aws/aws-parallelcluster-cookbook,
cookbooks/aws-parallelcluster-slurm/recipes/install/install_pyxis.rb: "Pyxis is disabled by default" since 3.11.1);
the queue's partition named after the queue. There is no HyperPod resource_config.json: each node's action is told
its group. As in test_lifecycle_slurm.py, a stand-in SPANK plugin built from libslurm-dev's spank.h takes pyxis's
place, and only ``hostname`` and the AWS commands are stubbed. The configuration's observability is on, as shipped:
Docker is the stand-in of test_observability.py (no Docker engine runs here), and the head node's Slurm exporter
runs for real, as its systemd unit starts it.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import free_port  # noqa: E402
from slurm_harness import SlurmCluster, SlurmUnavailable  # noqa: E402
from test_imds_access import XTABLES_STUB  # noqa: E402
from test_lifecycle_scripts import ROOT, Sandbox, succeeded  # noqa: E402
from test_lifecycle_slurm import standin_plugin  # noqa: E402,F401 (a fixture)
from test_observability import DOCKER_STUB, REMOTE_WRITE_URL, get, stub  # noqa: E402
from test_parallelcluster_node import BUNDLE, PARAMETER, publish  # noqa: E402
from test_teams_slurm import GpuAccountingCluster, sacctmgr  # noqa: E402

from moe_cdk.constructs.hyperpod_slurm_cluster import FsxMount, provisioning_parameters  # noqa: E402
from moe_cdk.jobs.slurm_job import job_spec_from_config, render_sbatch  # noqa: E402
from moe_cdk.rules.teams import QosTier, Team, TeamMember, TeamsConfig  # noqa: E402
from moe_cdk.schema.config import load_config  # noqa: E402
from moe_cdk.stacks._shared import node_observability  # noqa: E402

CONFIG = load_config(ROOT / "config/parallelcluster.yaml")
FSX = FsxMount(
    file_system_id="fs-0123456789abcdef0", availability_zone="us-east-2a", efa_enabled=False,
    dns_name_parameter="/moe-cdk/moe-pc/fsx/dns-name", mount_name_parameter="/moe-cdk/moe-pc/fsx/mount-name",
)  # fmt: skip


@contextmanager
def node_sandbox(plugin: str, teams: TeamsConfig | None = None) -> Iterator[Sandbox]:
    """A sandbox with config/parallelcluster.yaml's parameters (and ``teams``) and the bundle published to the stub
    S3, and pyxis installed as ParallelCluster's AMI installs it; no Slurm runs yet. The sandbox is in a folder the
    slurm user and the members may read (pytest's tmp folders are root's alone)."""
    params = provisioning_parameters(
        instance_groups=[g.to_props() for g in CONFIG.cluster.instance_groups], region=CONFIG.region, fsx=FSX,
        observability=node_observability(CONFIG), teams=teams, parallelcluster=True,
    )  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="moeci-pcluster-"))
    base.chmod(0o755)
    box = Sandbox(base / "node", params=copy.deepcopy(params))
    (box.root / "opt/ml/config/resource_config.json").unlink()
    for name in ("scontrol", "strigger", "sacctmgr"):
        (box.bin / name).unlink(missing_ok=True)
    publish(box, {params["observability"]["remote_write_url_parameter"]: REMOTE_WRITE_URL})
    stub(box, "docker", DOCKER_STUB)
    box.write("usr/local/share/pyxis/pyxis.conf", f"required {plugin}\n")
    try:
        yield box
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def box(standin_plugin):  # noqa: F811 (the fixture imported above)
    with node_sandbox(standin_plugin) as sandbox:
        yield sandbox


@contextmanager
def slurm_of(box: Sandbox, cluster: type[SlurmCluster] = SlurmCluster, **options) -> Iterator[SlurmCluster]:
    """The cluster's Slurm, whose partition is the queue's: slurmctld as SlurmUser=slurm, as ParallelCluster's
    slurm.conf sets it (aws/aws-parallelcluster-cookbook, templates/default/slurm/slurm.conf.erb)."""
    try:
        with cluster(etc_dir=box.root / "opt/slurm/etc", partition="gpu", slurm_user="slurm", **options) as slurm:
            yield slurm
    except SlurmUnavailable as error:
        pytest.fail(f"a real Slurm is needed for this test: {error}")


def custom_action(box: Sandbox, group: str, hostname: str, bundle: str = BUNDLE, **env: str):
    """The node's OnNodeConfigured action, as ParallelCluster runs it: the entry script with the action's Args (the
    bundle's URI on a compute node, its SSM parameter on the head node)."""
    return succeeded(
        box.run(
            "bash", str(box.lc / "parallelcluster_entry.sh"), bundle, "us-east-2", group,
            MOE_LC_TARGET=str(box.base / f"lifecycle-{hostname}"),
            SLURM_CONF=str(box.root / "opt/slurm/etc/slurm.conf"), MOE_STUB_HOSTNAME=hostname, **env,
        )
    )  # fmt: skip


def compute_actions(box: Sandbox) -> None:
    """Both compute nodes' actions, run before any Slurm daemon as on ParallelCluster, which starts a compute node's
    slurmd in its finalize phase, after OnNodeConfigured (aws/aws-parallelcluster, compute_node/user_data.sh; the
    cookbook's recipes/finalize/finalize_compute.rb). A step that waited for Slurm would fail within 10 s."""
    for node in ("node1", "node2"):
        custom_action(box, "gpu", node, MOE_LC_SLURM_WAIT_S="10")


def test_after_the_head_and_compute_actions_srun_reaches_pyxis_on_every_node(box):
    compute_actions(box)
    # The head node's action runs once slurmctld is up: ParallelCluster starts it in its config phase
    # (recipes/config/config_head_node.rb), before OnNodeConfigured.
    with slurm_of(box) as slurm:
        assert "SlurmUser               = slurm(" in slurm.run("scontrol", "show", "config").stdout
        before = slurm.run("srun", "-N2", "--container-image=x", "true", timeout=60)
        assert before.returncode != 0 and "unrecognized option" in before.stderr
        custom_action(box, "head", "head", bundle=PARAMETER)
        image = "123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:1"
        job = slurm.run("srun", "-N2", f"--container-image={image}", "printenv", "MOE_STANDIN_IMAGE", timeout=60)
        assert job.returncode == 0, job.stderr + slurm.log_tail(20)
        assert job.stdout.split() == [image] * 2


def test_the_rendered_job_of_the_configuration_runs_on_the_queue(box, tmp_path):
    # The job asks for efa, which ParallelCluster's slurm.conf gives an EFA queue's nodes, as the test Slurm's does;
    # /bin/true stands in for the trainer's interpreter, so the script runs end to end in seconds.
    compute_actions(box)
    spec = job_spec_from_config(CONFIG, local=True, python="/bin/true", time_limit="00:10:00", signal_lead_seconds=60)
    script = tmp_path / "train.sbatch"
    script.write_text(render_sbatch(spec).replace("/fsx/", f"{tmp_path}/fsx/"))
    with slurm_of(box) as slurm:
        job_id = slurm.submit(script)
        state = slurm.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=90)
    assert (state.state, state.fields["Partition"], state.fields["NodeList"]) == ("COMPLETED", "gpu", "node[1-2]"), (
        state.fields
    )


def scrape(url: str, deadline_s: float = 30) -> dict:
    """(sample name, sorted labels) -> value of the exporter at ``url``, once it answers."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            _, text = get(url)
            break
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer within {deadline_s}s"
            time.sleep(0.2)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_after_every_action_the_head_nodes_slurm_exporter_answers_with_the_queues_nodes(box):
    compute_actions(box)
    with slurm_of(box) as slurm:
        custom_action(box, "head", "head", bundle=PARAMETER)
        targets = box.root / "etc/moe-cdk/prometheus/targets"
        assert [t["labels"]["node"] for t in json.loads((targets / "efa.json").read_text())] == ["node1", "node2"]
        # The exporter as its unit starts it, on a free port rather than the unit's fixed one.
        unit = box.read("etc/systemd/system/moe-cdk-slurm-exporter.service")
        (command,) = [
            shlex.split(line.removeprefix("ExecStart=")) for line in unit.splitlines() if "ExecStart=" in line
        ]
        port = free_port()
        command[command.index("--listen-address") + 1] = f"127.0.0.1:{port}"
        exporter = subprocess.Popen(command, env=slurm.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            samples = scrape(f"http://127.0.0.1:{port}/metrics")
        finally:
            exporter.terminate()
            exporter.wait(timeout=10)
    assert samples[("moe_slurm_up", ())] == 1
    assert samples[("moe_slurm_nodes", (("partition", "gpu"), ("state", "idle")))] == 2


TEAMS = TeamsConfig(
    qos=(QosTier(name="normal", priority=50, max_gpus=16),),
    teams=(Team(name="research", share_percent=100, members=(TeamMember(name="alice", uid=2201),)),),
)


# systemd, as far as the steps ask it: slurmctld runs under it (ParallelCluster's slurmctld.service), and a restart
# makes slurmctld read slurm.conf again; every other unit is started or reloaded without a word.
SYSTEMCTL = """#!/usr/bin/env bash
echo "systemctl $*" >>"${MOE_STUB_CALLS}"
case "$*" in
  "restart slurmctld") exec scontrol reconfigure ;;
esac
exit 0
"""


@pytest.fixture
def teams_box(standin_plugin):  # noqa: F811 (the fixture imported above)
    """The sandbox with teams: the node's accounts (ParallelCluster's admin user among them), iptables, and systemd
    running slurmctld."""
    with node_sandbox(standin_plugin, TEAMS) as sandbox:
        sandbox.copy_system_accounts()
        with open(sandbox.root / "etc/passwd", "a") as passwd:
            passwd.write("pcluster-admin:x:400:400::/home/pcluster-admin:/bin/bash\n")
        (sandbox.root / "fsx").mkdir(exist_ok=True)
        for name in ("iptables", "ip6tables"):
            stub(sandbox, name, XTABLES_STUB)
        (sandbox.bin / "systemctl").write_text(SYSTEMCTL)
        yield sandbox


def test_with_teams_the_head_nodes_action_sets_up_accounting_and_keeps_it_after_an_update(teams_box):
    # GpuAccountingCluster's slurm.conf tracks GPUs as ParallelCluster's does with the CustomSlurmSettings moe-cdk
    # gives it (AccountingStorageTRES=gres/gpu; GresTypes=gpu is ParallelCluster's own).
    box = teams_box
    compute_actions(box)
    assert "alice:x:2201:" in box.read("etc/passwd")
    with slurm_of(box, GpuAccountingCluster, accounting=True) as slurm:
        custom_action(box, "head", "head", bundle=PARAMETER)
        rows = sacctmgr(slurm, "show", "assoc", "where", "account=research", "format=account,user,fairshare")
        assert {"research||100", "research|alice|1"} <= set(rows)
        assert "PreemptType             = preempt/qos" in slurm.run("scontrol", "show", "config").stdout
        # ParallelCluster rewrites slurm.conf on an update, without our Include line; then it runs the head node's
        # OnNodeUpdated, which names the bundle directly.
        conf = box.root / "opt/slurm/etc/slurm.conf"
        conf.write_text("".join(line for line in conf.read_text().splitlines(True) if "moe-cdk-teams" not in line))
        custom_action(box, "head", "head")
        assert "moe-cdk-teams.conf" in conf.read_text()
    # ParallelCluster's admin user still reaches IMDS on the head node (imds_access.sh).
    assert any("--uid-owner 400 " in line for line in box.calls("iptables"))
