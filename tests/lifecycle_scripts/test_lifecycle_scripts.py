"""The HyperPod lifecycle scripts, executed in a sandbox, one behaviour per test.

Each sandbox is a temporary folder with
  root/   the node's file system (MOE_LC_ROOT), laid out as HyperPod documents its nodes:
          /opt/ml/config/resource_config.json, the instance id in the DMI asset tag, an EFA
          device under sys/class/infiniband, the NVMe at /opt/dlami/nvme, Slurm under
          /opt/slurm (configless: a compute node has no slurm.conf), pyxis's shipped
          /usr/local/share/pyxis/pyxis.conf, a stock /etc/fstab and /etc/enroot/enroot.conf;
  lc/     a copy of lifecycle_scripts/ with a provisioning_parameters.json beside on_create.sh;
  bin/    stubs, first on PATH, for mount, mountpoint, modprobe, lctl, ip, findmnt, aws, scontrol,
          strigger, lnetctl, enroot, fi_info, hostname, systemctl and apt-get; each appends "NAME ARGS" to
          state/calls.log. (tests/test_lifecycle_slurm.py runs the Slurm steps on a real Slurm.)
The stubs keep the mounted paths in state/mounts: `mount` adds its target (or fails with
MOE_STUB_MOUNT_FAIL=1), `mountpoint -q` succeeds only for a listed path, and `mount` with no
arguments prints them as a mount table.

Mount points on command lines carry the sandbox prefix (root/fsx); /etc/fstab names the mount
point as the node sees it (/fsx).

The EKS variant ("workload_manager": "eks") uses tests/fixtures/eks_provisioning_parameters.json,
the shape the CDK construct generates, and a stock /etc/containerd/config.toml.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from node_packages import ENROOT_VERSION, enroot_debs, manifest, pyxis_repo

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "lifecycle_scripts"
DNS_PARAMETER = "/moe-cdk/moe/fsx/dns-name"
MOUNT_NAME_PARAMETER = "/moe-cdk/moe/fsx/mount-name"
FSTAB_LINE = "fs.example@tcp:/abcdefgh /fsx lustre noatime,flock,_netdev 0 0"
STOCK_FSTAB = "LABEL=cloudimg-rootfs\t/\text4\tdefaults,discard\t0 1\n"
STOCK_ENROOT_CONF = "#ENROOT_LIBRARY_PATH /usr/lib/enroot\nENROOT_SQUASH_OPTIONS -comp lzo -noD\n"

PARAMS = {
    "version": "1.0.0",
    "workload_manager": "slurm",
    "region": "us-east-2",
    "controller_group": "controller",
    "login_group": "login",
    "worker_groups": [
        {
            "instance_group_name": "gpu",
            "partition_name": "gpu",
            "instance_type": "ml.p5en.48xlarge",
            "features": ["efa", "p5en", "gpu"],
        },
    ],
    "fsx_lustre": {
        "dns_name_parameter": DNS_PARAMETER,
        "mount_name_parameter": MOUNT_NAME_PARAMETER,
        "mount_point": "/fsx",
    },
    "container_runtime": {"enroot_data_dir": "/opt/dlami/nvme/enroot", "pyxis": True},
}


def resource_config(gpu_group: str = "gpu") -> dict:
    return {
        "ClusterConfig": {"ClusterArn": "arn:aws:sagemaker:us-east-2:111122223333:cluster/abc", "ClusterName": "moe"},
        "InstanceGroups": [
            {
                "Name": "controller",
                "InstanceType": "ml.m5.2xlarge",
                "Instances": [
                    {
                        "InstanceName": "controller-1",
                        "AgentIpAddress": "10.0.1.10",
                        "CustomerIpAddress": "10.0.64.10",
                        "InstanceId": "i-0123",
                    }
                ],
            },
            {
                "Name": "login",
                "InstanceType": "ml.m5.2xlarge",
                "Instances": [{"InstanceName": "login-1", "CustomerIpAddress": "10.0.64.12", "InstanceId": "i-0789"}],
            },
            {
                "Name": gpu_group,
                "InstanceType": "ml.p5en.48xlarge",
                "Instances": [
                    {"InstanceName": "gpu-1", "CustomerIpAddress": "10.0.64.11", "InstanceId": "i-0456"},
                    {"InstanceName": "gpu-2", "CustomerIpAddress": "10.0.64.13", "InstanceId": "i-0abc"},
                ],
            },
        ],
    }


STUBS = {
    "mount": r"""
if [ "$#" -eq 0 ]; then
  while read -r target; do echo "stub on ${target} type stub (rw)"; done <"${MOE_STUB_STATE}/mounts"
  exit 0
fi
if [ "${MOE_STUB_MOUNT_FAIL:-0}" = 1 ]; then
  echo "mount.lustre: mount failed: Input/output error" >&2
  exit 5
fi
for target; do :; done
echo "${target}" >>"${MOE_STUB_STATE}/mounts"
""",
    "mountpoint": r"""
[ "$1" = -q ] && shift
grep -qxF -- "$1" "${MOE_STUB_STATE}/mounts"
""",
    "modprobe": "exit 0\n",
    "lctl": r"""[ "$1" = list_nids ] && echo "10.0.64.11@tcp"
exit 0
""",
    # LNet's networks in state/lnet-<net>, one interface a line (the kernel's state: lost on reboot).
    "lnetctl": r"""[ "${MOE_STUB_LNETCTL_FAIL:-0}" = 1 ] && exit 1
[ "$1 $2" = "net show" ] && cat "${MOE_STUB_STATE}/lnet-$4" 2>/dev/null
[ "$1 $2" = "net add" ] && echo "$6" >>"${MOE_STUB_STATE}/lnet-$4"
exit 0
""",
    "ip": r"""if [ "$1 $2 $3" = "route show default" ]; then
  echo "default via 10.0.64.1 dev ens5 proto dhcp src 10.0.64.11 metric 100"
fi
exit 0
""",
    "findmnt": r"""echo "TARGET SOURCE FSTYPE OPTIONS"
while read -r target; do echo "${target} stub stub rw"; done <"${MOE_STUB_STATE}/mounts"
""",
    "aws": r"""
count=$(( $(cat "${MOE_STUB_STATE}/aws_calls" 2>/dev/null || echo 0) + 1 ))
echo "${count}" >"${MOE_STUB_STATE}/aws_calls"
if [ "${count}" -le "${MOE_STUB_AWS_FAILURES:-0}" ]; then
  echo "An error occurred (ThrottlingException) when calling the GetParameter operation" >&2
  exit 254
fi
name=""
while [ "$#" -gt 0 ]; do
  if [ "$1" = --name ]; then name="$2"; fi
  shift
done
case "${name}" in
  /moe-cdk/moe/fsx/dns-name) echo "fs.example" ;;
  /moe-cdk/moe/fsx/mount-name) echo "abcdefgh" ;;
  *) echo "An error occurred (ParameterNotFound)" >&2; exit 254 ;;
esac
""",
    # A Slurm that is up (MOE_STUB_SLURM_USER: its SlurmUser), down with MOE_STUB_SLURM_DOWN=1, or up
    # only MOE_STUB_SLURM_UP_AFTER_S seconds after its first call (when it reads its configuration);
    # updates and reconfigure succeed.
    "scontrol": r"""
down="${MOE_STUB_SLURM_DOWN:-0}"
if [ -n "${MOE_STUB_SLURM_UP_AFTER_S:-}" ]; then
  [ -f "${MOE_STUB_STATE}/slurm_since" ] || date +%s >"${MOE_STUB_STATE}/slurm_since"
  [ $(($(date +%s) - $(cat "${MOE_STUB_STATE}/slurm_since"))) -ge "${MOE_STUB_SLURM_UP_AFTER_S}" ] || down=1
fi
if [ "${down}" = 1 ]; then
  echo "slurm_load_ctl_conf error: Unable to contact slurm controller" >&2
  exit 1
fi
case "$1 $2" in
  "ping "*)
    echo "Slurmctld(primary) at localhost is UP"
    # MOE_STUB_SLURM_BACKUP=1: a second controller, whose line comes after a pause (a reader that
    # stops at the first "is UP" has gone by then).
    if [ "${MOE_STUB_SLURM_BACKUP:-0}" = 1 ]; then
      sleep 0.2
      echo "Slurmctld(backup) at ip-10-0-64-12 is UP"
    fi ;;
  "show node") echo "NodeName=$4 Arch=x86_64 State=IDLE ThreadsPerCore=1" ;;
  "show config")
    # As Slurm 22.05 prints it: the moment of the query, then slurmctld's start (MOE_STUB_SLURM_UP_AFTER_S
    # after the first call, or long before this run). MOE_STUB_SLURM_ANSWER_DELAY_S: a slow answer.
    sleep "${MOE_STUB_SLURM_ANSWER_DELAY_S:-0}"
    booted_at=1767225600
    if [ -n "${MOE_STUB_SLURM_UP_AFTER_S:-}" ]; then
      booted_at=$(($(cat "${MOE_STUB_STATE}/slurm_since") + MOE_STUB_SLURM_UP_AFTER_S))
    fi
    echo "Configuration data as of $(date +%FT%T)"
    echo "BOOT_TIME               = $(date -d "@${booted_at}" +%FT%T)"
    echo "SlurmUser               = ${MOE_STUB_SLURM_USER:-root}(0)" ;;
esac
exit 0
""",
    "strigger": r"""
touch "${MOE_STUB_STATE}/triggers"
case "$1" in
  --get) cat "${MOE_STUB_STATE}/triggers" ;;
  --set) echo "$*" >>"${MOE_STUB_STATE}/triggers" ;;
esac
""",
    "enroot": r"""[ "$1" = version ] && echo "3.5.0"
exit 0
""",
    "fi_info": 'exit "${MOE_STUB_FI_INFO_RC:-0}"\n',
    "hostname": r"""
case "$1" in
  -I) echo "${MOE_STUB_IPS:-}" ;;
  -s) echo "${MOE_STUB_HOSTNAME:-ip-10-0-64-11}" ;;
  *) echo "${MOE_STUB_HOSTNAME:-ip-10-0-64-11}.us-east-2.compute.internal" ;;
esac
""",
    "systemctl": r"""
# is-active: only the units in MOE_STUB_ACTIVE (default: containerd) are running.
if [ "$1" = is-active ]; then
  for unit in ${MOE_STUB_ACTIVE-containerd}; do [ "${unit}" = "$3" ] && exit 0; done
  exit 3
fi
# show dlami-nvme -p PROPERTY...: MOE_STUB_NVME_UNIT is "none" (default: no such unit), or "late:N": the
# unit is still starting for N-1 queries, then has mounted the NVMe (added to the stub mount table).
# As systemctl does, only the properties asked for are printed, in the order asked.
if [ "$1 $2" = "show dlami-nvme" ]; then
  case "${MOE_STUB_NVME_UNIT:-none}" in
    none) load=not-found active=inactive ;;
    late:*)
      polls=$(( $(cat "${MOE_STUB_STATE}/nvme_polls" 2>/dev/null || echo 0) + 1 ))
      echo "${polls}" >"${MOE_STUB_STATE}/nvme_polls"
      load=loaded active=activating
      if [ "${polls}" -ge "${MOE_STUB_NVME_UNIT#late:}" ]; then
        grep -qxF "${MOE_LC_ROOT}/opt/dlami/nvme" "${MOE_STUB_STATE}/mounts" \
          || echo "${MOE_LC_ROOT}/opt/dlami/nvme" >>"${MOE_STUB_STATE}/mounts"
        active=active
      fi
      ;;
  esac
  shift 2
  while [ "$#" -ge 2 ] && [ "$1" = -p ]; do
    case "$2" in
      LoadState) echo "LoadState=${load}" ;;
      ActiveState) echo "ActiveState=${active}" ;;
      ExecMainStatus) echo "ExecMainStatus=0" ;;
    esac
    shift 2
  done
fi
exit 0
""",
    # Ubuntu's apt-get: package names are only recorded; a .deb file is unpacked into the sandbox
    # (dpkg-deb, the real one) and its usr/bin commands are put on PATH.
    "apt-get": r"""
[ "${MOE_STUB_APT_RC:-0}" = 0 ] || { echo "E: Unable to locate package" >&2; exit "${MOE_STUB_APT_RC}"; }
for arg; do
  case "${arg}" in
    *.deb)
      dpkg-deb -x "${arg}" "${MOE_LC_ROOT}"
      for command in "${MOE_LC_ROOT}"/usr/bin/*; do ln -sf "${command}" "$(dirname "$0")/"; done
      ;;
  esac
done
exit 0
""",
}


class Sandbox:
    """A node's file system, a copy of lifecycle_scripts/ and stubbed commands."""

    def __init__(
        self, base: Path, instance_id: str | None = "i-0456", params: dict | None = None, resource: dict | None = None
    ):
        self.base = base
        self.root = base / "root"
        self.lc = base / "lc"
        self.bin = base / "bin"
        self.state = base / "state"
        for folder in (self.bin, self.state):
            folder.mkdir(parents=True)
        shutil.copytree(SCRIPTS, self.lc, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        self.pin_packages()
        self.write_params(PARAMS if params is None else params)
        self.write("opt/ml/config/resource_config.json", json.dumps(resource or resource_config()))
        if instance_id:
            self.write("sys/devices/virtual/dmi/id/board_asset_tag", instance_id + "\n")
        (self.root / "sys/class/infiniband/rdmap0s6").mkdir(parents=True)
        (self.root / "opt/dlami/nvme").mkdir(parents=True)
        self.write("usr/local/lib/slurm/spank_pyxis.so", "")
        self.write("usr/local/share/pyxis/pyxis.conf", f"required {self.root}/usr/local/lib/slurm/spank_pyxis.so\n")
        self.write("etc/fstab", STOCK_FSTAB)
        self.write("etc/enroot/enroot.conf", STOCK_ENROOT_CONF)
        (self.state / "mounts").write_text(f"{self.root}/opt/dlami/nvme\n")
        (self.state / "calls.log").write_text("")
        for name, body in STUBS.items():
            stub = self.bin / name
            stub.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"${{MOE_STUB_CALLS}}"\n{body}')
            stub.chmod(0o755)

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def copy_system_accounts(self) -> None:
        """This machine's system accounts (ids below 1000, and nobody) as the sandbox's user database: an AMI's own.
        Users and groups above them are left out: the real-Slurm teams tests add members to this machine's database
        while other tests run beside them, and a sandbox that copied them would start with a team already made."""

        def rows(name: str) -> list[list[str]]:
            return [line.split(":") for line in Path(f"/etc/{name}").read_text().splitlines()]

        users = {row[0] for row in rows("passwd") if int(row[2]) < 1000 or int(row[2]) == 65534}
        groups = {row[0] for row in rows("group") if int(row[2]) < 1000 or int(row[2]) == 65534}
        for name, names in (("passwd", users), ("shadow", users), ("group", groups), ("gshadow", groups)):
            table = [row for row in rows(name) if row[0] in names]
            if name in ("group", "gshadow"):  # the last field lists the group's members
                table = [[*row[:-1], ",".join(m for m in row[-1].split(",") if m in users)] for row in table]
            self.write(f"etc/{name}", "".join(":".join(row) + "\n" for row in table))

    def pin_packages(self, *, enroot=None, pyxis=None, enroot_check: str | None = None) -> None:
        """The sandbox's node_packages.txt: the stand-ins given (node_packages.py), the rest absent."""
        (self.lc / "node_packages.txt").write_text(
            manifest(enroot=enroot, pyxis=pyxis, base=self.base, enroot_check=enroot_check)
        )

    def without(self, *commands: str) -> str:
        """A PATH of the sandbox's stubs and the system's folders on which none of ``commands`` is found."""
        for name in commands:
            (self.bin / name).unlink(missing_ok=True)
        path = os.pathsep.join(
            [str(self.bin), os.path.dirname(shutil.which("python3")), "/usr/sbin:/usr/bin:/sbin:/bin"]
        )
        assert all(shutil.which(name, path=path) is None for name in commands), commands
        return path

    def records(self, result: subprocess.CompletedProcess) -> list[dict]:
        """The step records (lib.sh) the run printed, in order."""
        marker = " moe-cdk-step "
        lines = (result.stdout + result.stderr).splitlines()
        return [json.loads(line.split(marker, 1)[1]) for line in lines if marker in line]

    def write_params(self, params: dict) -> None:
        (self.lc / "provisioning_parameters.json").write_text(json.dumps(params, indent=2))

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_LC_", "MOE_STUB_", "NCCL_", "FI_"))}
        env.update(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            MOE_LC_ROOT=str(self.root),
            MOE_LC_RETRY_DELAY_SCALE="0",
            MOE_LC_POLL_S="1",
            MOE_STUB_CALLS=str(self.state / "calls.log"),
            MOE_STUB_STATE=str(self.state),
            TMPDIR=str(self.base),
        )
        env.update(extra)
        return env

    def run(self, *command: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(command), cwd=self.base, env=self.env(**extra), capture_output=True, text=True, timeout=60, check=False
        )

    def on_create(self, **extra: str) -> subprocess.CompletedProcess:
        return self.run("bash", str(self.lc / "on_create.sh"), **extra)

    def node_info(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return self.run("python3", str(self.lc / "node_info.py"), *args, **extra)

    def calls(self, prefix: str = "") -> list[str]:
        lines = (self.state / "calls.log").read_text().splitlines()
        return [line for line in lines if line.startswith(prefix)]

    def read(self, relative: str) -> str:
        return (self.root / relative).read_text()


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    """The sandbox of compute node gpu-1 (found by its instance id), not yet run."""
    return Sandbox(tmp_path)


@pytest.fixture(scope="module")
def compute_run(tmp_path_factory) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """One successful on_create.sh run on compute node gpu-1, shared by the read-only tests."""
    box = Sandbox(tmp_path_factory.mktemp("compute"))
    return box, succeeded(box.on_create())


# ---- a compute node ---------------------------------------------------------------------


def test_compute_node_mounts_fsx_with_lustre_options(compute_run):
    box, _ = compute_run
    assert box.calls("mount -t") == [
        f"mount -t lustre -o noatime,flock,_netdev fs.example@tcp:/abcdefgh {box.root}/fsx"
    ]


def test_compute_node_reads_fsx_names_from_ssm(compute_run):
    box, _ = compute_run
    assert box.calls("aws") == [
        f"aws ssm get-parameter --name {name} --query Parameter.Value --output text --region us-east-2"
        for name in (DNS_PARAMETER, MOUNT_NAME_PARAMETER)
    ]


def test_compute_node_writes_one_fstab_line(compute_run):
    box, _ = compute_run
    assert box.read("etc/fstab") == STOCK_FSTAB + FSTAB_LINE + "\n"


def test_compute_node_points_enroot_at_nvme(compute_run):
    box, _ = compute_run
    conf = box.read("etc/enroot/enroot.conf").splitlines()
    assert conf[0].startswith("# BEGIN moe-cdk")
    assert conf[1:7] == [
        "ENROOT_RUNTIME_PATH /opt/dlami/nvme/enroot/runtime/user-$(id -u)",
        "ENROOT_CACHE_PATH /opt/dlami/nvme/enroot/cache/user-$(id -u)",
        "ENROOT_DATA_PATH /opt/dlami/nvme/enroot/data/user-$(id -u)",
        "ENROOT_TEMP_PATH /opt/dlami/nvme/enroot/tmp",
        "ENROOT_CONFIG_PATH ${HOME}/.config/enroot",
        "# END moe-cdk",
    ]
    assert "\n".join(conf[7:]) + "\n" == STOCK_ENROOT_CONF


def test_compute_node_creates_shared_enroot_dirs(compute_run):
    box, _ = compute_run
    for sub in ("runtime", "cache", "data", "tmp"):
        assert (box.root / "opt/dlami/nvme/enroot" / sub).stat().st_mode & 0o7777 == 0o1777


def test_compute_node_links_pyxis_conf_under_opt_slurm(compute_run):
    box, _ = compute_run
    link = box.root / "opt/slurm/etc/plugstack.conf.d/pyxis.conf"
    assert link.is_symlink()
    assert Path(os.readlink(link)) == box.root / "usr/local/share/pyxis/pyxis.conf"


def test_compute_node_leaves_plugstack_conf_to_the_controller(compute_run):
    box, _ = compute_run
    assert not (box.root / "opt/slurm/etc/plugstack.conf").exists()
    assert "scontrol reconfigure" not in box.calls("scontrol")


def test_compute_node_installs_efa_env(compute_run):
    box, _ = compute_run
    assert box.read("etc/profile.d/moe-cdk-efa.sh") == (SCRIPTS / "efa_env.sh").read_text()


def test_compute_node_sets_slurm_features(compute_run):
    box, _ = compute_run
    assert box.calls("scontrol update") == [
        "scontrol update NodeName=ip-10-0-64-11 AvailableFeatures=efa,p5en,gpu ActiveFeatures=efa,p5en,gpu "
        "Extra=moe-cdk-features:efa,p5en,gpu"
    ]


def test_compute_node_leaves_slurm_conf_to_hyperpod(compute_run):
    box, _ = compute_run
    assert not (box.root / "etc/slurm/slurm.conf").exists()
    assert not list(box.root.rglob("slurm.conf"))


def test_compute_node_logs_every_step_to_the_log_file(compute_run):
    box, result = compute_run
    log = box.read("var/log/provision/moe-cdk-lifecycle.log")
    for step in ("validate", "node_info", "efa_env", "mount_fsx", "setup_enroot", "setup_pyxis", "slurm_features"):
        assert f"[{step}] step finished in" in log
    assert "[on_create] on_create.sh finished in" in result.stdout
    assert all(line[:20].endswith("Z") and line[4] == "-" and line[10] == "T" for line in log.splitlines())


# ---- idempotency, roles, failures ---------------------------------------------------------


def test_the_steps_read_the_node_facts_on_create_loaded_without_starting_python_again(sandbox):
    # on_create.sh exports what node_info.py printed (lib.sh, MOE_LC_NODE_FACTS); otherwise each step would read the
    # same files again: 9 more Python starts on a compute node.
    python3 = sandbox.bin / "python3"
    python3.write_text(
        f'#!/usr/bin/env bash\necho "python3 $*" >>"${{MOE_STUB_CALLS}}"\nexec {shutil.which("python3")} "$@"\n'
    )
    python3.chmod(0o755)
    succeeded(sandbox.on_create())
    node_info = [call for call in sandbox.calls("python3") if "node_info.py" in call]
    assert [call.split("node_info.py ")[1].split()[0] for call in node_info] == [
        "--check",
        str(sandbox.root / "opt/ml/config/resource_config.json"),
        "--params",
    ], node_info


def test_second_run_changes_nothing(sandbox):
    succeeded(sandbox.on_create())
    enroot_conf = sandbox.read("etc/enroot/enroot.conf")
    second = succeeded(sandbox.on_create())
    assert len(sandbox.calls("mount -t")) == 1
    assert "/fsx is already mounted" in second.stdout
    assert sandbox.read("etc/fstab").count(FSTAB_LINE) == 1
    assert sandbox.read("etc/enroot/enroot.conf") == enroot_conf


def test_controller_node_skips_enroot_and_sets_no_features(tmp_path):
    box = Sandbox(tmp_path, instance_id=None)  # found through `hostname -I`
    result = succeeded(box.on_create(MOE_STUB_IPS="172.17.0.1 10.0.64.10"))
    assert "role controller" in result.stdout
    assert not [call for call in box.calls("scontrol") if call.startswith("scontrol update")]
    assert box.read("etc/enroot/enroot.conf") == STOCK_ENROOT_CONF
    assert len(box.calls("mount -t lustre")) == 1


def test_controller_includes_pyxis_in_its_plugstack_and_reconfigures(tmp_path):
    box = Sandbox(tmp_path, instance_id="i-0123")
    box.write("opt/slurm/etc/plugstack.conf", "# HyperPod's plugstack.conf\n")
    succeeded(box.on_create())
    assert box.read("opt/slurm/etc/plugstack.conf") == (
        f"# HyperPod's plugstack.conf\ninclude {box.root}/opt/slurm/etc/plugstack.conf.d/pyxis.conf\n"
    )
    assert box.calls("scontrol reconfigure") == ["scontrol reconfigure"] and box.calls("scontrol update") == []


def test_controller_reconfigures_a_slurmctld_that_started_before_the_change_however_late_it_answers(tmp_path):
    # "Configuration data as of" is the moment of the query, not of slurmctld's start: taking it for
    # the start skipped the reconfigure whenever the answer came a second after the change (CI, 310e7b0+).
    box = Sandbox(tmp_path, instance_id="i-0123")
    box.write("opt/slurm/etc/plugstack.conf", "# HyperPod's plugstack.conf\n")
    result = succeeded(box.on_create(MOE_STUB_SLURM_ANSWER_DELAY_S="1.2"))
    assert box.calls("scontrol reconfigure") == ["scontrol reconfigure"], result.stdout


def test_controller_does_not_reconfigure_a_slurmctld_that_started_after_the_change(tmp_path):
    # Such a slurmctld already serves the new plugstack.conf; a reconfigure then reaches only slurmd
    # daemons that are starting, which Slurm 22.05 can crash (test_node_matrix's late variants).
    box = Sandbox(tmp_path, instance_id="i-0123")
    box.write("opt/slurm/etc/plugstack.conf", "# HyperPod's plugstack.conf\n")
    result = succeeded(box.on_create(MOE_STUB_SLURM_UP_AFTER_S="3"))
    assert "include " in box.read("opt/slurm/etc/plugstack.conf") and box.calls("scontrol reconfigure") == []
    assert "after plugstack.conf changed: the nodes fetch the new file from it; no reconfigure" in result.stdout


def test_controller_leaves_hyperpods_pyxis_registration_alone(tmp_path):
    box = Sandbox(tmp_path, instance_id="i-0123")
    registered = "include /opt/slurm/etc/plugstack.conf.d/pyxis.conf\n"
    box.write("opt/slurm/etc/plugstack.conf", registered)
    result = succeeded(box.on_create())
    assert "pyxis is already registered" in result.stdout
    assert box.read("opt/slurm/etc/plugstack.conf") == registered and box.calls("scontrol reconfigure") == []


def test_controller_registers_the_feature_trigger_once(tmp_path):
    box = Sandbox(tmp_path, instance_id="i-0123")
    succeeded(box.on_create())
    succeeded(box.on_create())
    assert box.calls("strigger --set") == [
        f"strigger --set --reconfig --flags=PERM --program=/usr/bin/env MOE_LC_ROOT={box.root} /bin/bash "
        f"{box.lc}/slurm_features.sh --reapply"
    ]


def test_login_node_configures_enroot_but_not_features(tmp_path):
    box = Sandbox(tmp_path, instance_id="i-0789")
    succeeded(box.on_create())
    assert box.read("etc/enroot/enroot.conf").startswith("# BEGIN moe-cdk")
    assert box.calls("scontrol") == []


def test_failing_mount_stops_with_diagnostics(sandbox):
    result = sandbox.on_create(MOE_STUB_MOUNT_FAIL="1")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "step:        mount_fsx" in output
    assert "command:     mount -t lustre -o noatime,flock,_netdev fs.example@tcp:/abcdefgh" in output
    assert "----- mount table (lustre, nvme) -----" in output
    assert "----- lctl list_nids -----\n10.0.64.11@tcp" in output
    assert "----- last 50 lines of" in output and "attempt 5/5 failed" in output
    assert output.count("moe-cdk lifecycle: FAILED") == 1
    assert len(sandbox.calls("mount -t lustre")) == 5
    assert sandbox.calls("scontrol") == []
    assert FSTAB_LINE not in sandbox.read("etc/fstab")


def test_transient_ssm_failures_are_retried(sandbox):
    result = succeeded(sandbox.on_create(MOE_STUB_AWS_FAILURES="2"))
    assert "attempt 2/5 failed (exit 254)" in result.stdout
    assert len(sandbox.calls("aws")) == 4
    assert len(sandbox.calls("mount -t lustre")) == 1


def test_missing_fsx_is_skipped(tmp_path):
    box = Sandbox(tmp_path, params={**PARAMS, "fsx_lustre": None})
    result = succeeded(box.on_create())
    assert "fsx_lustre is null" in result.stdout
    assert box.calls("mount -t") == [] and box.calls("aws") == []
    assert box.read("etc/fstab") == STOCK_FSTAB


def test_efa_feature_dropped_without_efa_device(sandbox):
    shutil.rmtree(sandbox.root / "sys/class/infiniband")
    result = succeeded(sandbox.on_create())
    assert "WARNING: dropping the efa feature" in result.stdout
    assert sandbox.calls("scontrol update") == [
        "scontrol update NodeName=ip-10-0-64-11 AvailableFeatures=p5en,gpu ActiveFeatures=p5en,gpu "
        "Extra=moe-cdk-features:p5en,gpu"
    ]


def test_efa_feature_dropped_when_fi_info_fails(sandbox):
    result = succeeded(sandbox.on_create(MOE_STUB_FI_INFO_RC="1"))
    assert "WARNING: fi_info -p efa failed" in result.stdout
    assert "AvailableFeatures=p5en,gpu" in sandbox.calls("scontrol update")[0]


def test_enroot_warns_when_nvme_is_not_mounted(sandbox):
    (sandbox.state / "mounts").write_text("")
    result = succeeded(sandbox.on_create())
    assert (
        "WARNING: /opt/dlami/nvme is not a mount point, so /opt/dlami/nvme/enroot is on the ROOT VOLUME"
        in result.stdout
    )


def test_nvme_mounted_late_is_waited_for(sandbox):
    # AWS's install_enroot_pyxis.sh waits up to 120 s for dlami-nvme.service "to combat race condition".
    (sandbox.state / "mounts").write_text("")
    result = succeeded(sandbox.on_create(MOE_STUB_NVME_UNIT="late:3"))
    assert "waiting for dlami-nvme.service to mount /opt/dlami/nvme" in result.stdout
    assert "ROOT VOLUME" not in result.stdout
    assert "enroot data goes to the instance NVMe: /opt/dlami/nvme/enroot" in result.stdout


def test_no_nvme_unit_means_no_wait(sandbox):
    (sandbox.state / "mounts").write_text("")
    result = succeeded(sandbox.on_create())
    assert "waiting for dlami-nvme" not in result.stdout and "ROOT VOLUME" in result.stdout


def test_missing_enroot_is_installed_from_the_pinned_packages(sandbox):
    path = sandbox.without("enroot")
    debs = enroot_debs(sandbox.base / "packages")
    sandbox.pin_packages(enroot=debs)
    result = succeeded(sandbox.on_create(PATH=path))
    dependencies, packages = sandbox.calls("apt-get")
    assert dependencies == (
        "apt-get -y -q -o DPkg::Lock::Timeout=120 install squashfs-tools parallel fuse-overlayfs squashfuse"
    )
    assert [Path(f).name for f in packages.split(" install ")[1].split()] == [debs[0].name, debs[1].name]
    assert f"enroot {ENROOT_VERSION}: sha256:" in result.stdout and "as pinned" in result.stdout
    assert f"installed enroot {ENROOT_VERSION}" in result.stdout
    assert sandbox.read("etc/enroot/enroot.conf").startswith("# BEGIN moe-cdk")


def test_enroot_package_with_another_digest_is_refused(sandbox):
    path = sandbox.without("enroot")
    sandbox.pin_packages(enroot=enroot_debs(sandbox.base / "packages"), enroot_check="sha256:" + "0" * 64)
    result = sandbox.on_create(PATH=path)
    assert result.returncode != 0
    (failed,) = [r for r in sandbox.records(result) if r["outcome"] == "failed"]
    assert failed["step"] == "setup_enroot" and failed["node"] == "i-0456" and failed["group"] == "gpu"
    assert (
        failed["hint"].startswith(f"enroot {ENROOT_VERSION} from file://")
        and "not the pinned sha256:000" in failed["hint"]
    )
    assert "nothing was installed" in failed["hint"]
    assert len(sandbox.calls("apt-get")) == 1  # the Ubuntu dependencies only, not the refused file


def test_enroot_package_without_a_pinned_digest_is_installed_with_a_warning(sandbox):
    path = sandbox.without("enroot")
    sandbox.pin_packages(enroot=enroot_debs(sandbox.base / "packages"), enroot_check="-")
    result = succeeded(sandbox.on_create(PATH=path))
    assert (
        "WARNING: enroot 3.4.1: " in result.stdout
        and "pinned by version only; it downloaded as sha256:" in result.stdout
    )


def test_enroot_that_cannot_be_downloaded_fails_with_a_hint(sandbox):
    result = sandbox.on_create(PATH=sandbox.without("enroot"))
    assert result.returncode != 0
    (failed,) = [r for r in sandbox.records(result) if r["outcome"] == "failed"]
    assert failed["step"] == "setup_enroot" and "curl -fsSL" in failed["hint"]
    assert "enroot could not be found or installed" in failed["hint"]


def without_pyxis(box: Sandbox) -> None:
    """No pyxis on the node; Slurm's headers (Debian's libslurm-dev) where HyperPod keeps them."""
    (box.root / "usr/local/share/pyxis/pyxis.conf").unlink()
    (box.root / "usr/local/lib/slurm/spank_pyxis.so").unlink()
    assert Path("/usr/include/slurm/spank.h").is_file(), "libslurm-dev is needed: make system-packages installs it"
    (box.root / "opt/slurm").mkdir(parents=True, exist_ok=True)
    (box.root / "opt/slurm/include").symlink_to("/usr/include")


def test_missing_pyxis_is_built_from_the_pinned_commit(sandbox):
    without_pyxis(sandbox)
    sandbox.pin_packages(pyxis=pyxis_repo(sandbox.base / "packages"))
    sandbox.write("opt/slurm/etc/cgroup.conf", "CgroupPlugin=autodetect\n")
    result = succeeded(sandbox.on_create(MOE_STUB_ACTIVE="slurmd"))
    plugin = sandbox.root / "usr/local/lib/slurm/spank_pyxis.so"
    assert sandbox.read("usr/local/share/pyxis/pyxis.conf") == f"required {plugin}\n"
    assert plugin.read_bytes()[:4] == b"\x7fELF"  # built here, by the source's own make install
    assert "pyxis 0.19.0: commit " in result.stdout and " as pinned" in result.stdout
    assert sandbox.read("opt/slurm/etc/cgroup.conf") == "CgroupPlugin=autodetect\nConstrainDevices=yes\n"
    assert sandbox.calls("systemctl restart") == ["systemctl restart slurmd"]


def test_pyxis_tag_at_another_commit_is_refused(sandbox):
    without_pyxis(sandbox)
    repo, _ = pyxis_repo(sandbox.base / "packages")
    sandbox.pin_packages(pyxis=(repo, "1" * 40))
    result = sandbox.on_create()
    (failed,) = [r for r in sandbox.records(result) if r["outcome"] == "failed"]
    assert failed["step"] == "setup_pyxis" and f"not the pinned {'1' * 40}: nothing was built" in failed["hint"]
    assert not (sandbox.root / "usr/local/share/pyxis/pyxis.conf").exists()


def test_pyxis_already_installed_is_not_rebuilt(compute_run):
    box, result = compute_run
    assert "pyxis is installed: " in result.stdout and box.calls("systemctl restart") == []


def test_successful_run_records_every_step_once(compute_run):
    box, result = compute_run
    records = box.records(result)
    assert [r["step"] for r in records] == [
        "validate",
        "node_info",
        "efa_env",
        "mount_fsx",
        "setup_enroot",
        "setup_pyxis",
        "slurm_features",
        "teams",
        "observability",
    ]
    assert {r["outcome"] for r in records} == {"ok"} and {r["node"] for r in records} == {"i-0456"}
    assert all(isinstance(r["seconds"], int) and "hint" not in r for r in records)


def test_failed_step_record_carries_a_hint_with_quotes_escaped(sandbox):
    sandbox.write("opt/ml/config/resource_config.json", "{}")
    result = sandbox.on_create()
    (failed,) = [r for r in sandbox.records(result) if r["outcome"] == "failed"]
    assert failed["step"] == "node_info" and "'python3 " in failed["hint"]
    assert "the cluster's instance groups and the configuration must have the same names" in failed["hint"]


def test_slurm_that_comes_up_after_the_retries_is_waited_for(sandbox):
    # Finding 2: the retries alone (6 attempts) gave up on a Slurm that starts after the lifecycle.
    # Against a real Slurm each failed attempt also takes scontrol's own ~9 s timeout, so the old
    # code outlasted about a minute there (test_node_matrix's 60 s late start passes without the fix);
    # this Slurm fails fast, as one does that is not listening yet, and answers 4 s after its first call.
    result = succeeded(sandbox.on_create(MOE_STUB_SLURM_UP_AFTER_S="4"))
    assert "waiting for slurmctld to answer (scontrol ping)" in result.stdout
    assert len(sandbox.calls("scontrol update")) == 1


def test_slurm_that_never_answers_fails_the_step_with_a_hint(sandbox):
    result = sandbox.on_create(MOE_STUB_SLURM_DOWN="1", MOE_LC_SLURM_WAIT_S="2")
    assert result.returncode != 0
    (failed,) = [r for r in sandbox.records(result) if r["outcome"] == "failed"]
    assert failed["step"] == "slurm_features"
    assert failed["hint"].startswith("slurmctld did not answer 'scontrol ping' within 2s: check that it runs")
    assert sandbox.calls("scontrol update") == []


def test_slurm_with_a_backup_controller_answers(sandbox):
    # Under pipefail, "cmd | grep -q" reads false when grep stops at its match while cmd is still writing
    # (here the backup controller's line), so this waited the whole limit and failed. The same race in
    # the dlami-nvme query failed test_nvme_mounted_late_is_waited_for once in CI (1 in 300 here).
    result = succeeded(sandbox.on_create(MOE_STUB_SLURM_BACKUP="1", MOE_LC_SLURM_WAIT_S="2"))
    assert "waiting for slurmctld" not in result.stdout
    assert len(sandbox.calls("scontrol update")) == 1


def test_invalid_parameters_stop_before_any_change(sandbox):
    sandbox.write_params({k: v for k, v in PARAMS.items() if k != "worker_groups"})
    result = sandbox.on_create()
    assert result.returncode == 2
    assert "worker_groups: missing" in result.stderr
    assert "step:        validate" in result.stderr
    assert sandbox.calls("mount -t") == [] and sandbox.calls("aws") == []


# ---- efa_env.sh -----------------------------------------------------------------------------


def sourced_env(shell: str, **preset: str) -> dict:
    result = subprocess.run(
        [shell, "-c", '. "$1" && env', "sh", str(SCRIPTS / "efa_env.sh")],
        env={"PATH": os.environ["PATH"], **preset},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def test_efa_env_sets_current_variables_only():
    env = sourced_env("bash")
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"
    assert env["NCCL_DEBUG"] == "WARN"
    for obsolete in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NCCL_PROTO"):
        assert obsolete not in env
    assert not [name for name in env if name.startswith("RDMAV_")]


def test_efa_env_keeps_callers_nccl_debug():
    assert sourced_env("bash", NCCL_DEBUG="INFO")["NCCL_DEBUG"] == "INFO"


@pytest.mark.skipif(not Path("/bin/sh").exists(), reason="no /bin/sh")
def test_efa_env_works_in_posix_sh():
    """/etc/profile sources profile.d with /bin/sh (dash on Ubuntu)."""
    assert sourced_env("/bin/sh")["FI_EFA_USE_HUGE_PAGE"] == "0"


# ---- node_info.py ---------------------------------------------------------------------------


def test_node_info_describes_compute_node(sandbox):
    result = succeeded(
        sandbox.node_info(
            str(sandbox.root / "opt/ml/config/resource_config.json"), str(sandbox.lc / "provisioning_parameters.json")
        )
    )
    assert result.stdout.splitlines() == [
        "NODE_GROUP=gpu",
        "NODE_ROLE=compute",
        "PARTITION=gpu",
        "FEATURES=efa,p5en,gpu",
        "INSTANCE_TYPE=ml.p5en.48xlarge",
        "INSTANCE_ID=i-0456",
        "LUSTRE_EFA_INTERFACES=0",
    ]


def test_node_info_finds_node_by_ip(tmp_path):
    box = Sandbox(tmp_path, instance_id=None)
    result = succeeded(
        box.node_info(
            str(box.root / "opt/ml/config/resource_config.json"),
            str(box.lc / "provisioning_parameters.json"),
            MOE_LC_IPS="10.0.64.13",
        )
    )
    assert "NODE_ROLE=compute" in result.stdout.splitlines()
    assert "INSTANCE_ID=i-0abc" in result.stdout.splitlines()


def test_node_info_rejects_unknown_group(tmp_path):
    box = Sandbox(tmp_path, resource=resource_config(gpu_group="gpu2"))
    result = box.node_info(
        str(box.root / "opt/ml/config/resource_config.json"), str(box.lc / "provisioning_parameters.json")
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "instance group: not in provisioning_parameters.json (got 'gpu2'; allowed controller, login, gpu)"
    ]


def test_node_info_rejects_unknown_node(tmp_path):
    box = Sandbox(tmp_path, instance_id=None)
    result = box.node_info(
        str(box.root / "opt/ml/config/resource_config.json"),
        str(box.lc / "provisioning_parameters.json"),
        MOE_LC_IPS="192.168.1.1",
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "node: not found in resource_config.json (got instance id 'unknown', addresses 192.168.1.1; allowed"
    )


def test_check_accepts_the_fixture(sandbox):
    result = succeeded(sandbox.node_info("--check", str(sandbox.lc / "provisioning_parameters.json")))
    assert result.stdout.startswith("OK: ")


def test_check_rejects_missing_worker_groups(sandbox):
    sandbox.write_params({k: v for k, v in PARAMS.items() if k != "worker_groups"})
    result = sandbox.node_info("--check", str(sandbox.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "worker_groups: missing (got nothing; allowed a non-empty list of worker groups)"
    ]


def test_check_reports_every_wrong_type(sandbox):
    params = copy.deepcopy(PARAMS)
    params["worker_groups"][0]["features"] = "efa"
    params["container_runtime"]["pyxis"] = "yes"
    params["fsx_lustre"]["mount_point"] = "fsx"
    sandbox.write_params(params)
    result = sandbox.node_info("--check", str(sandbox.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "worker_groups[0].features: invalid (got 'efa'; allowed a list of Slurm feature names)",
        "fsx_lustre.mount_point: invalid (got 'fsx'; allowed an absolute path other than '/')",
        "container_runtime.pyxis: invalid (got 'yes'; allowed true or false)",
    ]


# ---- static checks --------------------------------------------------------------------------


def script_files() -> list[Path]:
    return sorted(p for p in SCRIPTS.iterdir() if p.suffix in (".sh", ".py"))


def test_only_packages_sh_downloads_and_only_what_the_manifest_pins():
    # Software a node lacks comes from node_packages.txt through packages.sh; no other script downloads.
    for path in script_files():
        if path.name == "packages.sh":
            continue
        text = path.read_text().lower()
        for forbidden in ("curl", "wget", "git clone", "github.com"):
            assert forbidden not in text, f"{path.name} mentions {forbidden!r}"
    fetched = (SCRIPTS / "packages.sh").read_text()
    assert fetched.count("curl ") == 1 and fetched.count(" clone --") == 1 and "github.com" not in fetched


def test_the_manifest_pins_what_aws_reference_installs():
    # aws-samples/awsome-distributed-training at 7217859, base-config/utils/install_enroot_pyxis.sh:
    # ENROOT_VERSION=3.4.1 (release packages enroot and enroot+caps), PYXIS_VERSION=v0.19.0 (git).
    rows = {
        line.split()[0]: line.split()[1:]
        for line in (SCRIPTS / "node_packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert rows["enroot"][:2] == [
        "3.4.1",
        "https://github.com/NVIDIA/enroot/releases/download/v3.4.1/enroot_3.4.1-1_{arch}.deb",
    ]
    assert rows["enroot+caps"][0] == "3.4.1" and rows["enroot+caps"][1].endswith("/enroot+caps_3.4.1-1_{arch}.deb")
    # The v0.19.0 tag's commit in NVIDIA/pyxis's history.
    assert rows["pyxis"] == [
        "0.19.0",
        "https://github.com/NVIDIA/pyxis.git",
        "commit:e006b893e4b63303da154bf1800076dcd6a64bc9",
    ]


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the Makefile installs it for `make test`)")
    shell_scripts = [str(p) for p in script_files() if p.suffix == ".sh"]
    result = subprocess.run(
        [shellcheck, "-x", *shell_scripts], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---- EKS ("workload_manager": "eks") ---------------------------------------------------------

EKS_PARAMS = json.loads((Path(__file__).resolve().parents[1] / "fixtures/eks_provisioning_parameters.json").read_text())
CONTAINERD_CONFIG = "etc/containerd/config.toml"
STOCK_CONTAINERD_CONFIG = """version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
sandbox_image = "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/pause:3.5"

[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"
discard_unpacked_layers = true
"""


def eks_resource_config() -> dict:
    return {
        "ClusterConfig": {"ClusterArn": "arn:aws:sagemaker:us-east-2:111122223333:cluster/eks", "ClusterName": "moe"},
        "InstanceGroups": [
            {
                "Name": "accelerated",
                "InstanceType": "ml.p5en.48xlarge",
                "Instances": [
                    {"InstanceName": "accelerated-1", "CustomerIpAddress": "10.0.80.11", "InstanceId": "i-0e01"}
                ],
            },
            {
                "Name": "system",
                "InstanceType": "ml.m5.2xlarge",
                "Instances": [{"InstanceName": "system-1", "CustomerIpAddress": "10.0.80.21", "InstanceId": "i-0e02"}],
            },
        ],
    }


AL2_TEMPLATE = "etc/eks/containerd/containerd-config.toml"
AL2023_DROP_IN = "etc/systemd/system/containerd.service.d/10-moe-cdk-root.conf"
OS_RELEASE = {
    "al2": 'NAME="Amazon Linux"\nVERSION="2"\nID="amzn"\nVERSION_ID="2"\n',
    "al2023": 'NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nVERSION_ID="2023"\n',
}


def eks_sandbox(
    base: Path, instance_id: str = "i-0e01", config: str | None = STOCK_CONTAINERD_CONFIG, os: str | None = None
) -> Sandbox:
    """The sandbox of EKS node accelerated-1, with the AMI's containerd config.toml unless config is None,
    and, for os "al2" or "al2023", that EKS AMI's os-release and containerd files (AL2's bootstrap template;
    AL2023's config.toml as nodeadm writes it)."""
    box = Sandbox(base, instance_id=instance_id, params=EKS_PARAMS, resource=eks_resource_config())
    if config is not None:
        box.write(CONTAINERD_CONFIG, config)
    if os is not None:
        box.write("etc/os-release", OS_RELEASE[os])
    if os == "al2":
        box.write(AL2_TEMPLATE, STOCK_CONTAINERD_CONFIG)
    box.write("var/lib/kubelet/kubeconfig", "apiVersion: v1\n")
    box.write("var/lib/kubelet/.hidden", "x\n")
    return box


def with_root(config: str, root: str) -> str:
    return config.replace('root = "/var/lib/containerd"', f'root = "{root}"')


@pytest.fixture(scope="module")
def eks_run(tmp_path_factory) -> tuple[Sandbox, subprocess.CompletedProcess]:
    """One successful on_create.sh run on EKS node accelerated-1 (NVMe mounted), shared by read-only tests."""
    box = eks_sandbox(tmp_path_factory.mktemp("eks"))
    return box, succeeded(box.on_create())


def test_eks_fixture_passes_check(tmp_path):
    box = eks_sandbox(tmp_path)
    assert succeeded(box.node_info("--check", str(box.lc / "provisioning_parameters.json"))).stdout.startswith("OK: ")


@pytest.mark.parametrize(
    "instance_id, group, features, instance_type",
    [
        ("i-0e01", "accelerated", "efa,p5en,gpu", "ml.p5en.48xlarge"),
        ("i-0e02", "system", "m5,cpu", "ml.m5.2xlarge"),
    ],
)
def test_eks_node_info_makes_every_group_a_worker(tmp_path, instance_id, group, features, instance_type):
    box = eks_sandbox(tmp_path, instance_id=instance_id)
    result = succeeded(
        box.node_info(
            str(box.root / "opt/ml/config/resource_config.json"), str(box.lc / "provisioning_parameters.json")
        )
    )
    assert result.stdout.splitlines() == [
        f"NODE_GROUP={group}",
        "NODE_ROLE=worker",
        "PARTITION=",
        f"FEATURES={features}",
        f"INSTANCE_TYPE={instance_type}",
        f"INSTANCE_ID={instance_id}",
        "LUSTRE_EFA_INTERFACES=0",
    ]


def test_eks_params_prints_containerd_settings(tmp_path):
    box = eks_sandbox(tmp_path)
    result = succeeded(box.node_info("--params", str(box.lc / "provisioning_parameters.json")))
    lines = result.stdout.splitlines()
    assert "WORKLOAD_MANAGER=eks" in lines and "FSX_ENABLED=false" in lines
    assert "CONTAINERD_DATA_DIR=/opt/dlami/nvme/containerd" in lines
    assert "CONTAINERD_FALLBACK_DIR=/opt/sagemaker/containerd" in lines
    assert not [line for line in lines if line.startswith(("ENROOT_", "PYXIS"))]


def test_eks_node_puts_containerd_root_on_nvme(eks_run):
    box, result = eks_run
    assert box.read(CONTAINERD_CONFIG) == with_root(STOCK_CONTAINERD_CONFIG, "/opt/dlami/nvme/containerd")
    assert (box.root / "opt/dlami/nvme/containerd").stat().st_mode & 0o7777 == 0o711
    assert box.calls("systemctl restart") == ["systemctl restart containerd"]
    assert "containerd data goes to the instance NVMe: /opt/dlami/nvme/containerd" in result.stdout


def test_eks_node_installs_efa_env(eks_run):
    box, _ = eks_run
    assert box.read("etc/profile.d/moe-cdk-efa.sh") == (SCRIPTS / "efa_env.sh").read_text()


def test_eks_node_leaves_fstab_enroot_and_slurm_alone(eks_run):
    box, result = eks_run
    assert box.read("etc/fstab") == STOCK_FSTAB
    assert box.read("etc/enroot/enroot.conf") == STOCK_ENROOT_CONF
    assert not (box.root / "opt/slurm").exists()
    assert not (box.root / "fsx").exists()
    for command in ("mount", "aws", "scontrol", "strigger", "enroot", "modprobe"):
        assert box.calls(command + " ") == [], command
    for step in ("mount_fsx", "setup_enroot", "setup_pyxis and slurm_features"):
        assert f"skipping {step} on EKS: " in result.stdout
    log = box.read("var/log/provision/moe-cdk-lifecycle.log")
    for step in ("validate", "node_info", "efa_env", "setup_containerd"):
        assert f"[{step}] step finished in" in log


def test_eks_node_falls_back_to_sagemaker_volume_without_nvme(tmp_path):
    box = eks_sandbox(tmp_path)
    (box.state / "mounts").write_text("")
    result = succeeded(box.on_create())
    assert box.read(CONTAINERD_CONFIG) == with_root(STOCK_CONTAINERD_CONFIG, "/opt/sagemaker/containerd")
    assert (box.root / "opt/sagemaker/containerd").is_dir()
    assert not (box.root / "opt/dlami/nvme/containerd").exists()
    assert (
        "WARNING: /opt/dlami/nvme is not a mount point, so containerd data goes to /opt/sagemaker/containerd "
        "(container_runtime.fallback_data_dir) instead of /opt/dlami/nvme/containerd"
    ) in result.stdout
    assert box.calls("systemctl restart") == ["systemctl restart containerd"]


def test_eks_second_run_changes_nothing(tmp_path):
    box = eks_sandbox(tmp_path)
    succeeded(box.on_create())
    config = box.read(CONTAINERD_CONFIG)
    second = succeeded(box.on_create())
    assert box.read(CONTAINERD_CONFIG) == config
    assert len(box.calls("systemctl restart")) == 1
    assert "containerd's data root is already /opt/dlami/nvme/containerd; not restarting containerd" in second.stdout
    assert not list((box.root / "etc/containerd").glob("*.moe-cdk.*"))


def test_eks_inserts_root_only_at_top_level(tmp_path):
    config = 'version = 2\n\n[plugins."io.containerd.snapshotter.v1.example"]\n  root = "/var/lib/example"\n'
    box = eks_sandbox(tmp_path, config=config)
    succeeded(box.on_create())
    assert box.read(CONTAINERD_CONFIG) == 'root = "/opt/dlami/nvme/containerd"\n' + config
    assert box.calls("systemctl restart") == ["systemctl restart containerd"]


def test_eks_missing_containerd_config_fails_with_diagnostics(tmp_path):
    box = eks_sandbox(tmp_path, config=None)
    result = box.on_create()
    assert result.returncode != 0
    assert "ERROR: /etc/containerd/config.toml does not exist. SageMaker HyperPod's EKS AMI ships" in result.stdout
    assert "step:        setup_containerd" in result.stderr
    assert result.stderr.count("moe-cdk lifecycle: FAILED") == 1
    assert box.calls("systemctl") == []
    assert not (box.root / "opt/dlami/nvme/containerd").exists()


def test_setup_enroot_on_its_own_skips_eks(tmp_path):
    box = eks_sandbox(tmp_path)
    result = succeeded(box.run("bash", str(box.lc / "setup_enroot.sh")))
    assert "workload_manager is eks" in result.stdout
    assert box.read("etc/enroot/enroot.conf") == STOCK_ENROOT_CONF
    assert box.calls("enroot") == []


def test_compute_node_leaves_containerd_alone(compute_run):
    box, _ = compute_run
    assert box.calls("systemctl") == []
    assert not (box.root / "etc/containerd").exists()


def test_check_rejects_fsx_lustre_on_eks(tmp_path):
    box = eks_sandbox(tmp_path)
    box.write_params({**EKS_PARAMS, "fsx_lustre": PARAMS["fsx_lustre"]})
    result = box.node_info("--check", str(box.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith('fsx_lustre: not used on EKS (got {"dns_name_parameter": "/moe-cdk/moe/fsx/dns-name"')
    assert line.endswith(
        "; allowed null when workload_manager is 'eks': the FSx CSI driver mounts FSx for Lustre into pods)"
    )


def test_check_rejects_controller_group_on_eks(tmp_path):
    box = eks_sandbox(tmp_path)
    box.write_params({**EKS_PARAMS, "controller_group": "controller"})
    result = box.node_info("--check", str(box.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "controller_group: not used on EKS (got 'controller'; allowed null when workload_manager is 'eks')"
    ]


def test_check_rejects_slurm_container_runtime_on_eks(tmp_path):
    box = eks_sandbox(tmp_path)
    box.write_params({**EKS_PARAMS, "container_runtime": PARAMS["container_runtime"]})
    result = box.node_info("--check", str(box.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "container_runtime.containerd_data_dir: missing (got nothing; allowed an absolute path other than '/')",
        "container_runtime.fallback_data_dir: missing (got nothing; allowed an absolute path other than '/')",
        "container_runtime: unknown key (got 'enroot_data_dir'; allowed containerd_data_dir, fallback_data_dir)",
        "container_runtime: unknown key (got 'pyxis'; allowed containerd_data_dir, fallback_data_dir)",
    ]


def test_eks_al2_sets_the_root_in_the_bootstrap_template(tmp_path):
    box = eks_sandbox(tmp_path, config=None, os="al2")
    succeeded(box.on_create())
    assert box.read(AL2_TEMPLATE) == with_root(STOCK_CONTAINERD_CONFIG, "/opt/dlami/nvme/containerd")
    assert not (box.root / CONTAINERD_CONFIG).exists()


def test_eks_al2023_overrides_the_root_on_containerds_command_line(tmp_path):
    box = eks_sandbox(tmp_path, os="al2023")
    succeeded(box.on_create())
    assert box.read(CONTAINERD_CONFIG) == STOCK_CONTAINERD_CONFIG  # nodeadm's file stays nodeadm's
    assert box.read(AL2023_DROP_IN).splitlines()[1:] == [
        "[Service]",
        "ExecStart=",
        "ExecStart=/usr/bin/containerd --root /opt/dlami/nvme/containerd",
    ]
    assert box.calls("systemctl daemon-reload") and box.calls("systemctl restart") == ["systemctl restart containerd"]


def test_eks_al2023_does_not_start_a_stopped_containerd(tmp_path):
    box = eks_sandbox(tmp_path, os="al2023")
    result = succeeded(box.on_create(MOE_STUB_ACTIVE=""))
    assert box.calls("systemctl restart") == []
    assert "containerd is not running; it starts with its data root at /opt/dlami/nvme/containerd" in result.stdout


def test_eks_kubelet_folder_moves_to_the_nvme_with_its_files(eks_run):
    box, _ = eks_run
    link = box.root / "var/lib/kubelet"
    assert link.is_symlink() and os.readlink(link) == "/opt/dlami/nvme/kubelet"
    assert sorted(p.name for p in (box.root / "opt/dlami/nvme/kubelet").iterdir()) == [".hidden", "kubeconfig"]


def test_eks_kubelet_folder_stays_while_kubelet_runs(tmp_path):
    box = eks_sandbox(tmp_path)
    result = succeeded(box.on_create(MOE_STUB_ACTIVE="containerd kubelet"))
    assert not (box.root / "var/lib/kubelet").is_symlink()
    assert "WARNING: kubelet is running, so /var/lib/kubelet stays where it is" in result.stdout


def efa_file_system_sandbox(base: Path) -> Sandbox:
    """Compute node gpu-1 with three EFA devices, its group using two for an EFA-enabled file system."""
    params = copy.deepcopy(PARAMS)
    params["fsx_lustre"]["efa_interfaces"] = {"gpu": 2}
    box = Sandbox(base, params=params)
    for device in ("rdmap1s6", "rdmap2s6"):
        (box.root / "sys/class/infiniband" / device).mkdir()
    return box


def test_efa_file_system_adds_efa_interfaces_to_lnet_before_mounting(tmp_path):
    box = efa_file_system_sandbox(tmp_path)
    succeeded(box.on_create())
    calls = [c for c in box.calls() if c.startswith(("lnetctl", "mount -t"))]
    assert calls == [
        "lnetctl lnet configure",
        "lnetctl net show --net tcp",
        "lnetctl net add --net tcp --if ens5",
        "lnetctl net show --net efa",
        "lnetctl net add --net efa --if rdmap0s6 --peer-credits 32",
        "lnetctl net add --net efa --if rdmap1s6 --peer-credits 32",
        "mount -t lustre -o noatime,flock,_netdev fs.example@tcp:/abcdefgh " + str(box.root / "fsx"),
    ]


def test_efa_interfaces_already_in_lnet_are_not_added_again(tmp_path):
    box = efa_file_system_sandbox(tmp_path)
    (box.state / "lnet-efa").write_text("rdmap0s6\n")
    (box.state / "lnet-tcp").write_text("ens5\n")
    succeeded(box.on_create())
    assert box.calls("lnetctl net add") == ["lnetctl net add --net efa --if rdmap1s6 --peer-credits 32"]


def test_lnet_over_efa_is_configured_again_after_a_reboot(tmp_path):
    # Finding 6: lnetctl's configuration lives in the kernel, and HyperPod reboots nodes to recover them.
    box = efa_file_system_sandbox(tmp_path)
    succeeded(box.on_create())
    unit = box.root / "etc/systemd/system/moe-cdk-lnet-efa.service"
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    assert box.calls("systemctl enable") == ["systemctl enable moe-cdk-lnet-efa.service"]
    (exec_start,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
    assert exec_start == f"ExecStart=/bin/bash {box.lc}/mount_fsx.sh --lnet-efa 2"
    for state in box.state.glob("lnet-*"):  # the reboot
        state.unlink()
    succeeded(box.run(*exec_start.removeprefix("ExecStart=").split()))
    assert (box.state / "lnet-efa").read_text() == "rdmap0s6\nrdmap1s6\n"
    assert (box.state / "lnet-tcp").read_text() == "ens5\n"


def test_lnet_unit_is_installed_once(tmp_path):
    box = efa_file_system_sandbox(tmp_path)
    succeeded(box.on_create())
    (box.state / "mounts").write_text(f"{box.root}/opt/dlami/nvme\n")  # unmounted, as after a reboot
    second = succeeded(box.on_create())
    assert "moe-cdk-lnet-efa.service is already installed" in second.stdout
    assert len(box.calls("systemctl enable")) == 1


def test_lnet_failure_mounts_over_tcp_with_a_warning(tmp_path):
    box = efa_file_system_sandbox(tmp_path)
    result = succeeded(box.on_create(MOE_STUB_LNETCTL_FAIL="1"))
    assert "WARNING: Lustre over EFA is not configured; /fsx is mounted over TCP" in result.stdout
    assert len(box.calls("mount -t lustre")) == 1


def test_tcp_file_system_leaves_lnet_alone(compute_run):
    box, _ = compute_run
    assert box.calls("lnetctl") == []


def test_check_rejects_efa_interfaces_of_an_unknown_group(sandbox):
    params = copy.deepcopy(PARAMS)
    params["fsx_lustre"]["efa_interfaces"] = {"nope": 8}
    sandbox.write_params(params)
    result = sandbox.node_info("--check", str(sandbox.lc / "provisioning_parameters.json"))
    assert result.returncode == 2
    assert result.stderr.startswith('fsx_lustre.efa_interfaces: invalid (got {"nope": 8}')
