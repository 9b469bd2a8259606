"""Each team's group and private folder on the shared file system (slurm_teams.sh, ensure_team), and what one team's
member may do with another team's files, as the kernel decides it for the member's uid and groups (FSx for Lustre
checks the same numeric ids). Users are made in the sandbox's own /etc/passwd and /etc/group (--prefix)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lifecycle_scripts import Sandbox  # noqa: E402
from test_teams_homes import teams_node  # noqa: E402

from moe_cdk.rules.teams import FIRST_TEAM_GID, QosTier, Team, TeamMember, TeamsConfig  # noqa: E402

CAROL, DAVE = ("carol", 2301), ("dave", 2302)
TEAMS = TeamsConfig(
    qos=(QosTier(name="normal", priority=50),),
    teams=(
        Team(name="research", share_percent=50, members=(TeamMember(name=CAROL[0], uid=CAROL[1]),)),
        Team(name="prod", share_percent=50, members=(TeamMember(name=DAVE[0], uid=DAVE[1]),)),
    ),
)
RESEARCH_GID, PROD_GID = FIRST_TEAM_GID, FIRST_TEAM_GID + 1

if os.geteuid() != 0:  # pragma: no cover - the suite runs as root
    pytest.skip("the teams step makes users and groups: it needs root", allow_module_level=True)


@pytest.fixture
def box():
    """A compute node's sandbox after one run of the teams step."""
    with teams_node(TEAMS) as sandbox:
        done = sandbox.run("bash", str(sandbox.lc / "slurm_teams.sh"))
        assert done.returncode == 0, done.stdout + done.stderr
        yield sandbox


def as_member(user: tuple[str, int], team_gid: int, *command: str) -> subprocess.CompletedProcess:
    """``command`` with the member's uid, own group and team group, as a login would have them."""
    _, uid = user
    ids = [f"--reuid={uid}", f"--regid={uid}", f"--groups={uid},{team_gid}"]
    return subprocess.run(["setpriv", *ids, "--", *command], capture_output=True, text=True, timeout=30)


def group_line(box: Sandbox, name: str) -> list[str]:
    (line,) = [row for row in box.read("etc/group").splitlines() if row.startswith(f"{name}:")]
    return line.split(":")


def test_each_team_is_a_group_of_its_members_with_the_configured_gid(box):
    assert group_line(box, "research")[2:] == [str(RESEARCH_GID), CAROL[0]]
    assert group_line(box, "prod")[2:] == [str(PROD_GID), DAVE[0]]


def test_a_team_folder_is_roots_the_teams_group_and_setgid_2770(box):
    folder = box.root / "fsx/teams/research"
    info = folder.lstat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, RESEARCH_GID, 0o2770)


def test_a_member_writes_in_the_teams_folder_and_the_team_owns_what_is_written(box):
    target = box.root / "fsx/teams/research/checkpoint.txt"
    assert as_member(CAROL, RESEARCH_GID, "touch", str(target)).returncode == 0
    assert target.stat().st_gid == RESEARCH_GID


def test_a_member_of_another_team_can_neither_read_nor_write_the_folder(box):
    folder = box.root / "fsx/teams/research"
    (folder / "step-1").mkdir()
    assert "Permission denied" in as_member(DAVE, PROD_GID, "ls", str(folder)).stderr
    assert "Permission denied" in as_member(DAVE, PROD_GID, "touch", str(folder / "planted")).stderr


def test_a_member_of_another_team_cannot_read_a_home(box):
    assert "Permission denied" in as_member(DAVE, PROD_GID, "ls", str(box.root / "fsx" / CAROL[0])).stderr


def test_a_second_run_changes_no_group_and_no_folder(box):
    before = box.read("etc/group"), (box.root / "fsx/teams/prod").lstat()
    done = box.run("bash", str(box.lc / "slurm_teams.sh"))
    assert done.returncode == 0, done.stdout + done.stderr
    after = box.read("etc/group"), (box.root / "fsx/teams/prod").lstat()
    assert before[0] == after[0] and before[1].st_mode == after[1].st_mode and before[1].st_ino == after[1].st_ino
