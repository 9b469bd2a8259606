"""The teams step on a node where a member's uid is taken, and the skeleton files of a new home (slurm_teams.sh).

The step runs as root on a compute node (no Slurm needed). Its users are made in the sandbox's own /etc/passwd
(useradd --prefix), so nothing on this machine changes; the sandbox is in a folder the members may walk through.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_teams_homes import teams_node  # noqa: E402

from moe_cdk.rules.teams import QosTier, Team, TeamMember, TeamsConfig  # noqa: E402

if os.geteuid() != 0:  # pragma: no cover - the suite runs as root
    pytest.skip("the teams step makes users and hands files to them: it needs root", allow_module_level=True)

TAKEN_UID = 2411  # the image's own user on this node has it
TEAMS = TeamsConfig(
    qos=(QosTier(name="normal", priority=50),),
    teams=(
        Team(
            name="research",
            share_percent=100,
            members=(TeamMember(name="erin", uid=TAKEN_UID), TeamMember(name="frank", uid=2412)),
        ),
    ),
)
SKEL = {".bashrc": "# the image's bashrc\n", ".profile": "# the image's profile\n"}


@pytest.fixture(scope="module")
def clash():
    """A compute node whose own user `imageuser` has erin's uid, and an /etc/skel; the step run once."""
    with teams_node(TEAMS) as box:
        box.write(
            "etc/passwd", box.read("etc/passwd") + f"imageuser:x:{TAKEN_UID}:{TAKEN_UID}::/home/imageuser:/bin/sh\n"
        )
        for name, text in SKEL.items():
            box.write(f"etc/skel/{name}", text)
        yield box, box.run("bash", str(box.lc / "slurm_teams.sh"))


def users(box) -> dict[str, str]:
    return {line.split(":")[0]: line for line in box.read("etc/passwd").splitlines()}


def test_a_uid_clash_does_not_fail_the_node(clash):
    _, run = clash
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_clashing_member_is_skipped_with_a_timestamped_warning_naming_both_users(clash):
    box, run = clash
    (line,) = [line for line in run.stdout.splitlines() if "skipped" in line]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[", line), line
    assert f"team member erin skipped on this node: uid {TAKEN_UID} is already user imageuser's here" in line
    assert "erin" not in users(box) and not (box.root / "fsx/erin").exists()
    assert users(box)["imageuser"].startswith(f"imageuser:x:{TAKEN_UID}:")  # the image's user is untouched


def test_the_other_members_and_the_team_are_set_up(clash):
    box, _ = clash
    assert users(box)["frank"].startswith("frank:x:2412:")
    (group,) = [line for line in box.read("etc/group").splitlines() if line.startswith("research:")]
    assert group.split(":")[3] == "frank"
    assert (box.root / "fsx/frank/.ssh/authorized_keys").is_file() and (box.root / "fsx/teams/research").is_dir()


def test_a_new_home_gets_the_skeleton_files_owned_by_the_member(clash):
    box, _ = clash
    home = box.root / "fsx/frank"
    for name, text in SKEL.items():
        path = home / name
        assert path.read_text() == text and (path.stat().st_uid, path.stat().st_gid) == (2412, 2412), name


def test_an_existing_home_gets_no_skeleton_files(clash):
    # A second run finds the home made: the member's own .bashrc is left as the member changed it.
    box, _ = clash
    bashrc = box.root / "fsx/frank/.bashrc"
    bashrc.write_text("# frank's own\n")
    again = box.run("bash", str(box.lc / "slurm_teams.sh"))
    assert again.returncode == 0 and bashrc.read_text() == "# frank's own\n"
    assert "skeleton files" not in again.stdout
