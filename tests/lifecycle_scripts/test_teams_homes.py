"""The members' homes on the shared file system (slurm_teams.sh, ensure_home), one behaviour per test.

The step runs as root on a compute node (no Slurm needed: only the controller talks to slurmdbd). Its users are made
in the sandbox's own /etc/passwd (useradd --prefix), so nothing on this machine changes. What is written in a home is
written as the member (setpriv to the member's uid), so the sandbox lives in a folder the member may walk through
(pytest's own tmp folders are root's alone).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lifecycle_scripts import PARAMS, Sandbox, succeeded  # noqa: E402

from moe_cdk.constructs.hyperpod_slurm_cluster import teams_parameters  # noqa: E402
from moe_cdk.rules.teams import QosTier, Team, TeamMember, TeamsConfig  # noqa: E402

NAME = "carol"
UID = 2301
OTHER_GID = 100  # a group the member's files may be given ("users" on Debian and Ubuntu)
TEAMS = TeamsConfig(
    qos=(QosTier(name="normal", priority=50),),
    teams=(Team(name="research", share_percent=100, members=(TeamMember(name=NAME, uid=UID),)),),
)
CRAFTED = "* * * * * root id > /tmp/pwned\n"

if os.geteuid() != 0:  # pragma: no cover - the suite runs as root
    pytest.skip("the teams step makes users and hands files to them: it needs root", allow_module_level=True)


@contextmanager
def teams_node(teams: TeamsConfig) -> Iterator[Sandbox]:
    """A compute node's sandbox with ``teams`` and this machine's system accounts, not yet run, in a
    folder the members may walk through (pytest's tmp folders are root's alone); removed after."""
    base = Path(tempfile.mkdtemp(prefix="moeci-teams-"))
    base.chmod(0o755)
    try:
        sandbox = Sandbox(base, instance_id="i-0456", params=copy.deepcopy(PARAMS) | {"teams": teams_parameters(teams)})
        sandbox.copy_system_accounts()
        (sandbox.root / "fsx").mkdir(mode=0o755)
        yield sandbox
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def box():
    with teams_node(TEAMS) as sandbox:
        yield sandbox


def teams(box: Sandbox) -> subprocess.CompletedProcess:
    return box.run("bash", str(box.lc / "slurm_teams.sh"))


def home(box: Sandbox) -> Path:
    return box.root / "fsx" / NAME


def member_gid(box: Sandbox) -> int:
    (line,) = [row for row in box.read("etc/passwd").splitlines() if row.startswith(f"{NAME}:")]
    return int(line.split(":")[3])


def mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


def outside(box: Sandbox, name: str, text: str) -> Path:
    """A file of root's outside the home (mode 0644: the member cannot write it)."""
    path = box.base / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def plant_link(link: Path, target: Path) -> None:
    """A symbolic link the member made (the member owns the link)."""
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    os.lchown(link, UID, UID)


def test_a_new_home_is_private_and_the_members_with_the_members_group(box):
    succeeded(teams(box))
    stat = home(box).stat()
    assert (mode(home(box)), stat.st_uid, stat.st_gid) == (0o700, UID, member_gid(box))


def test_the_ssh_folder_and_keys_are_the_members_and_private(box):
    succeeded(teams(box))
    ssh = home(box) / ".ssh"
    for path, wanted in ((ssh, 0o700), (ssh / "id_ed25519", 0o600), (ssh / "authorized_keys", 0o600)):
        assert (mode(path), path.stat().st_uid, path.stat().st_gid) == (wanted, UID, member_gid(box)), path


def test_authorized_keys_holds_the_public_key_once_after_two_runs(box):
    succeeded(teams(box))
    second = succeeded(teams(box))
    ssh = home(box) / ".ssh"
    public = (ssh / "id_ed25519.pub").read_text().strip()
    assert public.startswith("ssh-ed25519 ") and public.endswith(f" {NAME}@moe-cdk")
    assert (ssh / "authorized_keys").read_text().splitlines() == [public]
    assert "SSH key pair made" not in second.stdout and "authorized_keys accepts" not in second.stdout


def test_a_planted_authorized_keys_link_is_not_followed_with_roots_rights(box):
    # The finding: authorized_keys a link to a file outside the home (in /etc/cron.d: a root cron job) and
    # id_ed25519.pub holding a cron line; the old step appended the line to the link's target as root.
    succeeded(teams(box))
    ssh = home(box) / ".ssh"
    target = outside(box, "cron", "# a stock cron file\n")
    plant_link(ssh / "authorized_keys", target)
    (ssh / "id_ed25519.pub").write_text(CRAFTED)
    second = teams(box)
    assert target.read_bytes() == b"# a stock cron file\n"
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"could not set up the SSH key of {NAME} in /fsx/{NAME}/.ssh, writing as {NAME}" in second.stdout


def test_a_planted_lock_link_in_the_home_is_not_followed(box):
    # The old step opened .ssh/.moe-cdk.lock for writing as root, which truncated a link's target.
    succeeded(teams(box))
    target = outside(box, "shadow", "root:*:19000:0:99999:7:::\n")
    plant_link(home(box) / ".ssh" / ".moe-cdk.lock", target)
    succeeded(teams(box))
    assert target.read_bytes() == b"root:*:19000:0:99999:7:::\n"


def test_the_lock_is_roots_on_the_shared_file_system(box):
    succeeded(teams(box))
    locks = box.root / "fsx/.moe-cdk/locks"
    for path in (locks.parent, locks, locks / f"{NAME}.lock"):
        assert not path.is_symlink() and path.stat().st_uid == 0 and not mode(path) & 0o022, path
    assert not (home(box) / ".ssh/.moe-cdk.lock").exists()


def test_a_lock_folder_a_member_could_write_is_refused(box):
    (box.root / "fsx/.moe-cdk").mkdir(mode=0o755)
    os.chown(box.root / "fsx/.moe-cdk", UID, UID)
    result = teams(box)
    assert result.returncode != 0
    assert f"{box.root}/fsx/.moe-cdk is owned by uid {UID} with mode 755" in result.stdout
    assert not home(box).exists()


def test_a_file_the_member_gave_another_group_keeps_it(box):
    # The old step ran chown -R over the whole home on every node, every run.
    succeeded(teams(box))
    shared = home(box) / "results.txt"
    shared.write_text("shared with the group\n")
    os.chown(shared, UID, OTHER_GID)
    succeeded(teams(box))
    assert (shared.stat().st_uid, shared.stat().st_gid) == (UID, OTHER_GID)


def test_a_home_made_by_the_old_step_is_left_as_it_is(box):
    # The old step made homes 0755 and chowned everything in them; a run of this one changes nothing there.
    succeeded(teams(box))
    ssh = home(box) / ".ssh"
    home(box).chmod(0o755)
    (ssh / ".moe-cdk.lock").write_text("")
    for path in (home(box), *ssh.parent.rglob("*")):
        os.lchown(path, UID, UID)
    before = {path: (path.lstat(), path.read_bytes() if path.is_file() else b"") for path in home(box).rglob("*")}
    result = succeeded(teams(box))
    assert mode(home(box)) == 0o755
    for path, (stat, data) in before.items():
        now = path.lstat()
        assert (now.st_mode, now.st_uid, now.st_gid, now.st_mtime_ns) == (
            stat.st_mode, stat.st_uid, stat.st_gid, stat.st_mtime_ns,
        ), path  # fmt: skip
        assert (path.read_bytes() if path.is_file() else b"") == data, path
    assert "made" not in result.stdout


def test_a_home_of_another_owner_gets_a_warning_and_no_key(box):
    (box.root / "fsx" / NAME).mkdir(mode=0o755)
    result = succeeded(teams(box))
    assert f"/fsx/{NAME} is not a folder owned by {NAME} (uid {UID}): left as it is" in result.stdout
    assert list(home(box).iterdir()) == [] and home(box).stat().st_uid == 0
