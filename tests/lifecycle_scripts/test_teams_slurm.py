"""Teams on a real Slurm with real accounting: the lifecycle step (slurm_teams.sh) run on the controller creates the
accounts, users, QoS tiers and fair share with sacctmgr against slurmdbd over MariaDB (slurm_harness, accounting=True),
turns on multifactor priority and QoS preemption, and a low-priority training job preempted by an urgent one is
requeued and resumes from its last checkpoint.

The node's users are created in the sandbox's own /etc/passwd (useradd --prefix), so nothing on this machine changes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from slurm_harness import Rejected, SlurmCluster, SlurmUnavailable  # noqa: E402
from test_lifecycle_scripts import PARAMS, Sandbox  # noqa: E402
from test_observability import load_script  # noqa: E402
from test_slurm import TinyJob, _resumed_step, _stopped_at, _wait_completed  # noqa: E402

from moe_cdk.constructs.hyperpod_slurm_cluster import teams_parameters  # noqa: E402
from moe_cdk.rules.teams import FIRST_TEAM_GID, QosTier, Team, TeamMember, TeamsConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = "i-0123"
# Long enough that the urgent job arrives (slurmctld schedules every 5 s here) while the low one still trains.
STEPS = 200
# A batch job runs this long before a normal one may preempt it (its tier's preempt_exempt_s): far above how soon
# a preemption happens here without it (the scheduler runs every 5 s).
EXEMPT_S = 25
TEAMS = TeamsConfig(
    qos=(
        QosTier(name="urgent", priority=100, preempts=("normal", "low"), max_gpus=16, max_gpus_per_user=32),
        QosTier(name="normal", priority=50, preempts=("low", "batch"), preempt_exempt_s=0),
        QosTier(name="low", priority=10, preempt_exempt_s=0),
        QosTier(name="batch", priority=5, preempt_exempt_s=EXEMPT_S, grace_time_s=0),
    ),
    teams=(
        Team(
            name="research",
            share_percent=60,
            members=(TeamMember(name="alice", uid=2101),),
            default_qos="low",
            max_gpus=16,
            max_gpus_per_user=8,
        ),
        Team(
            name="prod",
            share_percent=40,
            members=(TeamMember(name="bob", uid=2102),),
            default_qos="normal",
            max_jobs_per_user=2,
        ),
    ),
)


class GpuAccountingCluster(SlurmCluster):
    """The test cluster with GPUs tracked by accounting, as HyperPod's is (base-config setup_mariadb_accounting.sh
    sets AccountingStorageTRES=gres/gpu): sacctmgr then takes GPU limits. The nodes here have no GPUs."""

    def _slurm_conf(self) -> str:
        return super()._slurm_conf() + "GresTypes=gpu\nAccountingStorageTRES=gres/gpu\n"


@pytest.fixture(scope="module")
def controller():
    """The controller's sandbox and a Slurm with accounting whose slurm.conf is the sandbox's, after one run of the
    teams step (and a second, which must change nothing). The members write their homes' files themselves, so the
    sandbox is in a folder they may walk through (pytest's tmp folders are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="moeci-teams-"))
    base.chmod(0o755)
    params = copy.deepcopy(PARAMS) | {"teams": teams_parameters(TEAMS)}
    box = Sandbox(base, instance_id=CONTROLLER, params=params)
    for name in ("scontrol", "strigger", "sacctmgr"):
        (box.bin / name).unlink(missing_ok=True)
    box.copy_system_accounts()
    (box.root / "fsx").mkdir(exist_ok=True)
    slurm = GpuAccountingCluster(accounting=True, etc_dir=box.root / "opt/slurm/etc")
    try:
        slurm.start()
    except SlurmUnavailable as error:
        slurm.stop()
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no Slurm with accounting here: {error}")
    try:
        runs = [box.run("bash", str(box.lc / "slurm_teams.sh"), SLURM_CONF=str(slurm.conf)) for _ in range(2)]
        yield box, slurm, runs
    finally:
        slurm.stop()
        shutil.rmtree(base, ignore_errors=True)


# systemd cannot run here. Where it runs slurmctld (HyperPod's controller), the step restarts slurmctld through it;
# this stand-in says slurmctld is active and gives "restart" the effect a restart has on the settings: slurmctld
# reads slurm.conf again.
SYSTEMCTL_WITH_SLURMCTLD = """#!/usr/bin/env bash
echo "systemctl $*" >>"${MOE_STUB_CALLS}"
case "$*" in
  "is-active --quiet slurmctld") exit 0 ;;
  "restart slurmctld") exec scontrol reconfigure ;;
esac
exit 3
"""


@pytest.fixture(scope="module")
def controller_as_slurm_with_systemd():
    """The other answers to what AWS's sources leave open: slurmctld runs as SlurmUser=slurm (AWS's accounting
    scripts chown Slurm's files to slurm) and under systemd. The folders are readable by the slurm user."""
    base = Path(tempfile.mkdtemp(prefix="moeci-teams-"))
    base.chmod(0o755)
    params = copy.deepcopy(PARAMS) | {"teams": teams_parameters(TEAMS)}
    box = Sandbox(base, instance_id=CONTROLLER, params=params)
    for name in ("scontrol", "strigger", "sacctmgr"):
        (box.bin / name).unlink(missing_ok=True)
    (box.bin / "systemctl").write_text(SYSTEMCTL_WITH_SLURMCTLD)
    box.copy_system_accounts()
    (box.root / "fsx").mkdir(exist_ok=True)
    slurm = GpuAccountingCluster(accounting=True, etc_dir=box.root / "opt/slurm/etc", slurm_user="slurm")
    try:
        slurm.start()
    except SlurmUnavailable as error:
        slurm.stop()
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no Slurm with accounting here: {error}")
    try:
        yield box, slurm, box.run("bash", str(box.lc / "slurm_teams.sh"), SLURM_CONF=str(slurm.conf))
    finally:
        slurm.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_under_systemd_and_slurm_user_slurm_the_step_restarts_slurmctld(controller_as_slurm_with_systemd):
    box, slurm, run = controller_as_slurm_with_systemd
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SlurmUser               = slurm(" in slurm.run("scontrol", "show", "config").stdout
    assert box.calls("systemctl restart") == ["systemctl restart slurmctld"]
    assert "slurmctld restarted for the scheduler settings" in run.stdout
    assert "PreemptType             = preempt/qos" in slurm.run("scontrol", "show", "config").stdout
    rows = sacctmgr(slurm, "show", "assoc", "where", "account=research,prod", "format=account,user,fairshare")
    assert {"research||60", "prod||40", "research|alice|1", "prod|bob|1"} <= set(rows)


def test_without_systemd_the_step_reconfigures_and_says_what_waits_for_a_restart(controller):
    _, _, (first, _) = controller
    assert "no systemd slurmctld to restart: ran scontrol reconfigure" in first.stdout


def sacctmgr(slurm: SlurmCluster, *args: str) -> list[str]:
    done = slurm.run("sacctmgr", "-n", "-P", *args)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_the_step_succeeds_and_a_second_run_changes_nothing(controller):
    _, _, (first, second) = controller
    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0, second.stdout + second.stderr
    assert "added QoS urgent" in first.stdout and "added account research" in first.stdout
    assert "added" not in second.stdout and "scheduler settings unchanged" in second.stdout


def test_three_qos_tiers_with_their_priorities_and_preemption(controller):
    _, slurm, _ = controller
    rows = {r.split("|")[0]: r.split("|")[1:] for r in sacctmgr(slurm, "show", "qos", "format=name,priority,preempt")}
    assert rows["urgent"] == ["100", "low,normal"]
    assert rows["normal"] == ["50", "batch,low"]
    assert rows["low"] == ["10", ""]


def test_two_team_accounts_with_fair_share_users_and_default_qos(controller):
    _, slurm, _ = controller
    rows = sacctmgr(
        slurm, "show", "assoc", "where", "account=research,prod", "format=account,user,fairshare,defaultqos"
    )
    assert {"research||60|low", "prod||40|normal", "research|alice|1|low", "prod|bob|1|normal"} <= set(rows)


def test_fair_share_shows_in_sshare(controller):
    _, slurm, _ = controller
    done = slurm.run("sshare", "-a", "-P", "-o", "Account,User,RawShares,NormShares")
    assert done.returncode == 0, done.stderr
    shares = {tuple(line.split("|")[:3]): line for line in done.stdout.splitlines()}
    assert ("research", "", "60") in {(k[0].strip(), k[1], k[2]) for k in shares}
    assert ("prod", "", "40") in {(k[0].strip(), k[1], k[2]) for k in shares}


def test_priority_and_preemption_are_on(controller):
    box, slurm, _ = controller
    config = slurm.run("scontrol", "show", "config").stdout
    for line in ("PreemptType             = preempt/qos", "PreemptMode             = REQUEUE",
                 "PriorityType            = priority/multifactor"):  # fmt: skip
        assert line in config
    include = "Include moe-cdk-teams.conf"
    assert (box.root / "opt/slurm/etc/slurm.conf").read_text().count(include) == 1


def test_the_priority_weights_are_awss_guides(controller):
    # 03-qos-priority-preemption.md (awslabs/ai-on-sagemaker-hyperpod at a1d1d75): fair share weighs twice QoS.
    _, slurm, _ = controller
    config = config_of(slurm)
    assert {k: config[k] for k in ("PriorityWeightFairShare", "PriorityWeightQOS", "PriorityWeightAge")} == {
        "PriorityWeightFairShare": "5000", "PriorityWeightQOS": "2500", "PriorityWeightAge": "1000",
    }  # fmt: skip
    assert (config["PriorityUsageResetPeriod"], config["PriorityMaxAge"]) == ("MONTHLY", "7-00:00:00")


def config_of(slurm: SlurmCluster) -> dict[str, str]:
    shown = slurm.run("scontrol", "show", "config").stdout
    return {k.strip(): v.strip() for k, sep, v in (line.partition("=") for line in shown.splitlines()) if sep}


def test_each_tier_has_its_preempt_exempt_time_and_gpu_limits(controller):
    _, slurm, _ = controller
    rows = sacctmgr(slurm, "show", "qos", "format=name,preemptexempttime,maxtres,maxtrespu")
    assert {"urgent|00:30:00|gres/gpu=16|gres/gpu=32", "normal|00:00:00||", "low|00:00:00||",
            f"batch|00:00:{EXEMPT_S}||"} <= set(rows)  # fmt: skip


def test_team_gpu_caps_and_job_limits_are_on_the_associations(controller):
    _, slurm, _ = controller
    rows = sacctmgr(slurm, "show", "assoc", "where", "account=research,prod", "format=account,user,grptres,maxjobs")
    assert {"research||gres/gpu=16|", "research|alice|gres/gpu=8|", "prod|||2", "prod|bob||2"} <= set(rows)


def test_a_job_of_a_tier_with_an_exempt_time_is_preempted_only_after_it(controller, tmp_path):
    _, slurm, _ = controller
    for team in ("research", "prod"):  # the test submits as root
        slurm.run("sacctmgr", "-i", "add", "user", "root", f"account={team}")
    exclusive = ("--nodes=2", "--exclusive", f"--output={tmp_path / '%j.out'}")
    batch = slurm.run("sbatch", "--parsable", "--qos=batch", "--account=research", *exclusive, "--wrap", "sleep 300")
    batch_id = batch.stdout.strip()
    assert batch_id.isdigit(), batch.stderr
    try:
        started = slurm.wait_for(batch_id, {"RUNNING"}, timeout=60).fields["StartTime"]
        normal = slurm.run("sbatch", "--parsable", "--qos=normal", "--account=prod", *exclusive, "--wrap", "true")
        assert normal.stdout.strip().isdigit(), normal.stderr
        ran = slurm.wait_for(normal.stdout.strip(), {"COMPLETED"}, timeout=EXEMPT_S + 90).fields["StartTime"]
        waited = time.mktime(time.strptime(ran, "%Y-%m-%dT%H:%M:%S")) - time.mktime(
            time.strptime(started, "%Y-%m-%dT%H:%M:%S")
        )
        assert waited >= EXEMPT_S, f"preempted after {waited:.0f}s of its {EXEMPT_S}s exempt time"
        assert "PREEMPTED" in sacct_runs(slurm, batch_id) or "REQUEUED" in sacct_runs(slurm, batch_id)
    finally:
        slurm.run("scancel", batch_id)


def test_a_members_jobs_past_the_teams_max_jobs_per_user_wait(controller, tmp_path):
    # prod: max_jobs_per_user 2 (MaxJobs on its account, which its users' associations inherit). Limits are enforced
    # from slurmctld's next start (AccountingStorageEnforce).
    _, slurm, _ = controller
    slurm.restart_controller()
    slurm.run("sacctmgr", "-i", "add", "user", "root", "account=prod")
    jobs = []
    try:
        for _ in range(3):
            done = slurm.run("sbatch", "--parsable", "--account=prod", "-n1", f"--output={tmp_path / '%j.out'}",
                             "--wrap", "sleep 120")  # fmt: skip
            assert done.stdout.strip().isdigit(), done.stderr
            jobs.append(done.stdout.strip())
        for job_id in jobs[:2]:
            slurm.wait_for(job_id, {"RUNNING"}, timeout=60)
        deadline = time.monotonic() + 30
        while (state := slurm.job_state(jobs[2])).fields.get("Reason") != "AssocMaxJobsLimit":
            assert time.monotonic() < deadline and state.state == "PENDING", state.fields
            time.sleep(1)
    finally:
        slurm.run("scancel", *jobs)


def test_limits_taken_out_of_the_configuration_are_cleared(controller):
    box, slurm, _ = controller
    bare = TeamsConfig(
        qos=tuple(QosTier(name=t.name, priority=t.priority, preempts=t.preempts) for t in TEAMS.qos),
        teams=tuple(Team(name=t.name, share_percent=t.share_percent, members=t.members) for t in TEAMS.teams),
    )
    params = box.base / "without-limits.json"
    params.write_text(json.dumps(copy.deepcopy(PARAMS) | {"teams": teams_parameters(bare)}))
    apply = ("python3", str(box.lc / "slurm_teams.py"), "apply")
    limits = ("show", "assoc", "where", "account=research,prod", "format=account,user,grptres,maxjobs")
    assert {"research||gres/gpu=16|", "prod|||2"} <= set(sacctmgr(slurm, *limits))  # set by the step
    try:
        done = box.run(*apply, str(params), SLURM_CONF=str(slurm.conf))
        assert done.returncode == 0, done.stdout + done.stderr
        assert {"research|||", "research|alice||", "prod|||", "prod|bob||"} <= set(sacctmgr(slurm, *limits))
        assert "urgent||" in sacctmgr(slurm, "show", "qos", "format=name,maxtres,maxtrespu")
    finally:
        restored = box.run(*apply, str(box.lc / "provisioning_parameters.json"), SLURM_CONF=str(slurm.conf))
        assert restored.returncode == 0, restored.stdout + restored.stderr


def test_members_get_users_and_a_shared_home_with_their_ssh_key(controller):
    box, _, _ = controller
    passwd = (box.root / "etc/passwd").read_text()
    assert "alice:x:2101:2101::/fsx/alice:/bin/bash" in passwd and "bob:x:2102:" in passwd
    home = box.root / "fsx/alice"
    assert (home.stat().st_mode & 0o7777, home.stat().st_uid, home.stat().st_gid) == (0o700, 2101, 2101)
    ssh = home / ".ssh"
    public = (ssh / "id_ed25519.pub").read_text().strip()
    assert (ssh / "authorized_keys").read_text().splitlines() == [public]  # once, after two runs
    assert ssh.stat().st_uid == 2101 and (ssh / "id_ed25519").stat().st_mode & 0o777 == 0o600


def test_preempted_training_job_saves_where_it_stopped_and_resumes_at_the_next_step(controller, tmp_path):
    _, slurm, _ = controller
    for team in ("research", "prod"):  # the test submits as root
        slurm.run("sacctmgr", "-i", "add", "user", "root", f"account={team}")
    job = TinyJob(tmp_path, max_steps=STEPS, qos="low", account="research")
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    job.wait_for_steps(slurm, job_id, 8, timeout=120)
    urgent = slurm.run(
        "sbatch", "--parsable", "--qos=urgent", "--account=prod", "--nodes=2", "--exclusive",
        f"--output={tmp_path / 'urgent-%j.out'}", "--wrap", "sleep 5",
    ).stdout.strip()  # fmt: skip
    assert urgent.isdigit(), urgent
    slurm.wait_for(urgent, {"COMPLETED"}, timeout=120)
    state = _wait_completed(slurm, job, job_id, timeout=180)
    assert state.state == "COMPLETED" and state.restart_count >= 1
    log = job.log(job_id)
    first_run, second_run = log.split("SLURM_RESTART_COUNT=1", 1)
    assert "DUE TO PREEMPTION" in first_run or "CANCELLED AT" in first_run
    # The preemption's TERM reached every process of the step: the ranks saved at the step where they stopped, and
    # the requeued run goes on from the step after it: nothing is trained twice, nothing is skipped.
    stopped_at = _stopped_at(first_run)
    assert "Traceback" not in first_run and first_run.count("Exited with exit code 143") == 2, first_run[-4000:]
    assert _resumed_step(second_run) == stopped_at >= 8
    assert job.steps() == list(range(1, STEPS + 1))
    history = sacct_runs(slurm, job_id)
    assert "PREEMPTED" in history or "REQUEUED" in history, history


@pytest.fixture
def ubuntu():
    """The cluster's default user, which HyperPod's AMI has: made here for the test when this machine lacks it."""
    made = subprocess.run(["id", "ubuntu"], capture_output=True).returncode != 0
    if made:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", "ubuntu"], check=True)
    try:
        yield "ubuntu"
    finally:
        if made:
            subprocess.run(["userdel", "ubuntu"], check=False)


def test_an_operators_plain_sbatch_runs_after_the_teams_step(controller, ubuntu):
    # AccountingStorageEnforce, which holds from slurmctld's next start, rejects a job without a valid account
    # ("Invalid account or account/partition combination specified"); ubuntu is in no team.
    _, slurm, _ = controller
    slurm.restart_controller()
    out = Path(tempfile.mkdtemp(prefix="moeci-operator-"))
    out.chmod(0o777)
    try:
        done = subprocess.run(
            ["runuser", "-u", ubuntu, "--", "sbatch", "--parsable", f"--output={out}/%j.out", "--wrap", "id -un"],
            capture_output=True, text=True, timeout=30, env={**os.environ, "SLURM_CONF": str(slurm.conf)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        state = slurm.wait_for(job_id, {"COMPLETED"}, timeout=60)
        assert state.fields["Account"] == "operators" and (out / f"{job_id}.out").read_text() == "ubuntu\n"
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture
def members_on_this_machine(controller):
    """alice and bob, and their teams' groups, in this machine's user database too (slurmd runs a job as a user
    it finds there), with the ids the teams step gave them in the sandbox and the homes it made; removed after."""
    box, slurm, _ = controller
    made_users, made_groups = [], []
    for team, gid, member in (("research", FIRST_TEAM_GID, "alice"), ("prod", FIRST_TEAM_GID + 1, "bob")):
        if subprocess.run(["getent", "group", team], capture_output=True).returncode != 0:
            subprocess.run(["groupadd", "--gid", str(gid), team], check=True)
            made_groups.append(team)
        if subprocess.run(["id", member], capture_output=True).returncode != 0:
            uid = {"alice": 2101, "bob": 2102}[member]
            home = box.root / "fsx" / member
            subprocess.run(["useradd", "--uid", str(uid), "--user-group", "--no-create-home", "--home-dir", str(home),
                            "--groups", team, member], check=True)  # fmt: skip
            made_users.append(member)
    slurm.restart_controller()  # slurmctld learns the uids of associations made before the users existed
    try:
        yield box
    finally:
        for member in made_users:
            # A job left running by a failed test still runs as the member, and userdel refuses a user with
            # processes: the next test would find the user without its team group.
            subprocess.run(["pkill", "-KILL", "-u", member], check=False)
            deadline = time.monotonic() + 10
            while subprocess.run(["pgrep", "-u", member], capture_output=True).returncode == 0:
                assert time.monotonic() < deadline, f"{member}'s processes outlived SIGKILL"
                time.sleep(0.1)
            subprocess.run(["userdel", member], check=True)
        for team in made_groups:
            subprocess.run(["groupdel", team], check=False)


def run_as(user: str, *command: str, slurm: SlurmCluster) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def python_for_members():
    """Folders on the way to this interpreter and this checkout that other users may not enter (pyenv's Python is
    under /root, mode 0700 here) are opened to them (o+x: enter, not list) for the test, and closed after."""
    opened = []
    for target in (Path(os.path.realpath(sys.executable)), ROOT):
        for folder in reversed(target.parents):
            mode = folder.stat().st_mode
            if not mode & 0o001:
                folder.chmod(mode | 0o001)
                opened.append((folder, mode))
    try:
        yield
    finally:
        for folder, mode in reversed(opened):
            folder.chmod(mode)


TEAM_JOB_STEPS = 60


def test_a_job_of_each_teams_member_trains_and_resumes_in_the_teams_folder(
    controller, members_on_this_machine, python_for_members
):
    box = members_on_this_machine
    _, slurm, _ = controller
    jobs = {}
    for member, team in (("alice", "research"), ("bob", "prod")):
        run = box.root / "fsx/teams" / team / "run"
        assert run_as(member, "mkdir", str(run), slurm=slurm).returncode == 0  # as the member, in the team's folder
        job = TinyJob(run, max_steps=TEAM_JOB_STEPS, nodes=1, account=team, qos="urgent")
        submitted = run_as(member, "sbatch", "--parsable", str(job.script), slurm=slurm)
        assert submitted.returncode == 0, submitted.stderr
        jobs[member] = (job, submitted.stdout.strip())
    # Each job is requeued as soon as it has trained 12 steps, and has many left then: waiting for one job after the
    # other, at 24 steps, bob's job once finished while alice's was waited for, and saved no stop step.
    running, deadline = dict(jobs), time.monotonic() + 180
    while running:
        for member, (job, job_id) in list(running.items()):
            if len(job.steps()) >= 12:
                slurm.requeue(job_id)
                del running[member]
            else:
                state = slurm.job_state(job_id)
                assert state.state in ("PENDING", "RUNNING"), f"job {job_id} is {state.state}:\n{job.log(job_id)}"
        assert time.monotonic() < deadline, f"{sorted(running)}: fewer than 12 steps after 180 s"
        time.sleep(0.2)
    for job, job_id in jobs.values():
        state = _wait_completed(slurm, job, job_id, timeout=180)
        assert (state.state, state.restart_count) == ("COMPLETED", 1)
        first_run, second_run = job.log(job_id).split("SLURM_RESTART_COUNT=1", 1)
        assert _resumed_step(second_run) == _stopped_at(first_run) and job.steps() == list(range(1, TEAM_JOB_STEPS + 1))
        team_gid = job.root.parent.stat().st_gid
        assert {p.stat().st_gid for p in job.checkpoints.rglob("*")} == {team_gid}  # the team's, by setgid


def test_jobs_of_two_teams_members_write_their_own_folders_and_cannot_reach_each_others(
    controller, members_on_this_machine
):
    # Each member's job writes into its team's folder; then a job of bob's tries alice's checkpoints and home.
    box = members_on_this_machine
    _, slurm, _ = controller
    for member, team in (("alice", "research"), ("bob", "prod")):
        folder = box.root / "fsx/teams" / team
        write = f"mkdir {folder / 'checkpoints'} && echo {member} > {folder / 'checkpoints/step-1'}"
        out = box.root / "fsx" / member / "write.out"
        job = run_as(
            member, "sbatch", "--parsable", f"--account={team}", f"--output={out}", "--wrap", write, slurm=slurm
        )
        assert job.returncode == 0, job.stderr
        state = slurm.wait_for(job.stdout.strip(), {"COMPLETED", "FAILED"}, timeout=60)
        assert state.state == "COMPLETED", out.read_text()
        written = folder / "checkpoints/step-1"
        assert written.read_text() == f"{member}\n" and written.stat().st_gid == folder.stat().st_gid
    alice_checkpoints = box.root / "fsx/teams/research/checkpoints"
    probe = f"ls {alice_checkpoints}; cat {box.root / 'fsx/alice/.ssh/id_ed25519'}; touch {alice_checkpoints / 'x'}"
    out = box.root / "fsx/bob/probe.out"
    done = run_as("bob", "sbatch", "--parsable", "--account=prod", f"--output={out}", "--wrap", probe, slurm=slurm)
    assert done.returncode == 0, done.stderr
    slurm.wait_for(done.stdout.strip(), {"COMPLETED", "FAILED"}, timeout=60)
    refused = [line for line in out.read_text().splitlines() if "Permission denied" in line]
    assert len(refused) == 3 and not (alice_checkpoints / "x").exists(), out.read_text()


def sacct_runs(slurm: SlurmCluster, job_id: str) -> str:
    """The job's runs as accounting recorded them (sacct --duplicates lists each run of a requeued job)."""
    deadline = time.monotonic() + 30
    while True:
        done = slurm.run("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", "JobID,State")
        if done.stdout.count("\n") >= 2 or time.monotonic() > deadline:
            return done.stdout
        time.sleep(1)


def test_the_step_does_nothing_without_teams(tmp_path):
    box = Sandbox(tmp_path, instance_id=CONTROLLER)
    done = box.run("bash", str(box.lc / "slurm_teams.sh"))
    assert done.returncode == 0 and "no teams in the parameters: nothing to set up" in done.stdout


@pytest.mark.parametrize(
    ("teams", "key"),
    [
        ({"qos": [], "teams": [{"name": "../etc", "share_percent": 50}]}, "teams.teams[0]"),
        ({"qos": [], "teams": [{"name": "a", "share_percent": 5, "members": [{"name": "x y", "uid": 2001}]}]},
         "teams.teams[0].members[0]"),
        ({"qos": [{"name": "low", "priority": "high"}], "teams": []}, "teams.qos[0]"),
        ({"qos": "low"}, "teams"),
    ],
)  # fmt: skip
def test_the_node_refuses_teams_it_cannot_use_safely(tmp_path, teams, key):
    box = Sandbox(tmp_path, instance_id=CONTROLLER, params=copy.deepcopy(PARAMS) | {"teams": teams})
    done = box.run("python3", str(box.lc / "node_info.py"), "--check", str(box.lc / "provisioning_parameters.json"))
    assert done.returncode != 0 and f"{key}: invalid" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("version", "current", "expected"),
    [
        # Slurm 22.05 (Debian 12, run above): the flag is a SchedulerParameters option, the key's flags kept.
        ((22, 5), {"SchedulerParameters": "sched_interval=5"},
         "SchedulerParameters=sched_interval=5,preempt_send_user_signal"),
        # 23.02 and later (HyperPod's version is not published): PreemptParameters, "(null)" when unset.
        ((23, 11), {"PreemptParameters": "(null)"}, "PreemptParameters=send_user_signal"),
        ((24, 5), {"PreemptParameters": "send_user_signal"}, "PreemptParameters=send_user_signal"),
    ],
)  # fmt: skip
def test_the_preemption_signal_flag_follows_the_running_slurms_version(version, current, expected):
    signal_setting = load_script("slurm_teams").signal_setting
    assert signal_setting(version, current) == expected
