"""Instance metadata for root and the node's services only, on a Slurm cluster with teams (imds_access.sh).

Two ways:
  * in the sandbox of test_lifecycle_scripts.py, with stand-ins for iptables and ip6tables that record their
    arguments and keep the chains and OUTPUT's jumps in state/ (so -L, -N and -C answer as the real ones do): which
    rules each node role gets, that a second run issues the same ones and inserts the jump once, the ECR helper and
    its sudoers drop-in, the boot unit, and that nothing happens without teams;
  * in a network namespace of its own (unshare --net), with the real iptables and ip6tables: IMDS's addresses on
    the namespace's loopback, an HTTP server on each, and the script run twice; then root gets an answer and
    nobody's connection is refused. Nothing outside the namespace changes.
"""

from __future__ import annotations

import copy
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lifecycle_scripts import PARAMS, Sandbox, succeeded  # noqa: E402

from moe_cdk.constructs.hyperpod_slurm_cluster import teams_parameters  # noqa: E402
from moe_cdk.rules.teams import QosTier, Team, TeamMember, TeamsConfig  # noqa: E402

TEAMS = TeamsConfig(
    qos=(QosTier(name="normal", priority=50),),
    teams=(Team(name="research", share_percent=100, members=(TeamMember(name="carol", uid=2301),)),),
)
TEAMS_PARAMS = copy.deepcopy(PARAMS) | {"teams": teams_parameters(TEAMS)}
# Instance ids of resource_config() in test_lifecycle_scripts.py.
COMPUTE, CONTROLLER, LOGIN = "i-0456", "i-0123", "i-0789"
CHAIN = "MOE_CDK_IMDS"
HELPER = "usr/local/bin/moe-ecr-password"
SUDOERS = "etc/sudoers.d/moe-cdk-ecr"
RULES = "usr/local/sbin/moe-cdk-imds-rules"
UNIT = "etc/systemd/system/moe-cdk-imds.service"

if os.geteuid() != 0:  # pragma: no cover - the suite runs as root
    pytest.skip(
        "the script chowns what it installs to root, and the namespace test needs root", allow_module_level=True
    )

# iptables and ip6tables as the script calls them (always -w first): -n -L CHAIN succeeds for a chain made with -N
# (and for OUTPUT), -N fails for one that exists, -C OUTPUT RULE succeeds for a rule inserted with -I OUTPUT 1 RULE.
# MOE_STUB_NO_IPV6=1: ip6tables fails as it does on a kernel without IPv6.
XTABLES_STUB = r"""
name="$(basename "$0")"
if [ "${name}" = ip6tables ] && [ "${MOE_STUB_NO_IPV6:-0}" = 1 ]; then
  echo "ip6tables v1.8.9 (nf_tables): can't initialize ip6tables table 'filter'" >&2
  exit 3
fi
state="${MOE_STUB_STATE}/${name}"
mkdir -p "${state}"
touch "${state}/chains" "${state}/output"
[ "$1" = -w ] && shift
case "$1" in
  -n) [ "$3" = OUTPUT ] || grep -qxF -- "$3" "${state}/chains" ;;
  -N) if grep -qxF -- "$2" "${state}/chains"; then echo "${name}: Chain already exists." >&2; exit 1; fi
      echo "$2" >>"${state}/chains" ;;
  -C) shift 2; grep -qxF -- "$*" "${state}/output" ;;
  -I) shift 3; echo "$*" >>"${state}/output" ;;
esac
"""


def stub(box: Sandbox, name: str, body: str) -> None:
    path = box.bin / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"${{MOE_STUB_CALLS}}"\n{body}')
    path.chmod(0o755)


def make_box(base: Path, instance_id: str = COMPUTE, params: dict | None = None) -> Sandbox:
    box = Sandbox(base, instance_id=instance_id, params=copy.deepcopy(TEAMS_PARAMS if params is None else params))
    for name in ("iptables", "ip6tables"):
        stub(box, name, XTABLES_STUB)
    # Never the machine's own iptables: the sandbox's stand-ins come first on its PATH.
    assert all(shutil.which(n, path=box.env()["PATH"]) == str(box.bin / n) for n in ("iptables", "ip6tables"))
    return box


@pytest.fixture
def box(tmp_path) -> Sandbox:
    """The compute node gpu-1 of a cluster with teams, not yet run."""
    return make_box(tmp_path)


def imds_access(box: Sandbox, **extra: str) -> subprocess.CompletedProcess:
    return box.run("bash", str(box.lc / "imds_access.sh"), **extra)


def xtables_calls(box: Sandbox, tool: str) -> list[str]:
    return [line for line in box.calls(f"{tool} ") if line.split(" ", 1)[0] == tool]


def chain_rules(tool: str, address: str, *allowed: tuple[int, str]) -> list[str]:
    """The commands one run issues for TOOL when OUTPUT does not jump to the chain yet (the chain exists)."""
    return [
        f"{tool} -w -n -L {CHAIN}",
        f"{tool} -w -F {CHAIN}",
        *(
            f"{tool} -w -A {CHAIN} -m owner --uid-owner {uid} -m comment --comment moe-cdk: {who} -j RETURN"
            for uid, who in allowed
        ),
        f"{tool} -w -A {CHAIN} -m limit --limit 6/min -m comment --comment moe-cdk: log the refused "
        f"-j LOG --log-prefix moe-cdk IMDS refused:  --log-uid",
        f"{tool} -w -A {CHAIN} -m comment --comment moe-cdk: everyone else -j REJECT",
        f"{tool} -w -C OUTPUT -d {address} -j {CHAIN}",
    ]


# ---- without teams ------------------------------------------------------------------------------


def test_without_teams_the_script_changes_nothing(tmp_path):
    box = make_box(tmp_path, params=PARAMS)
    result = succeeded(imds_access(box))
    assert "no teams in the parameters: IMDS stays open to every user of this node; nothing to do" in result.stdout
    assert box.calls("iptables") == box.calls("ip6tables") == box.calls("systemctl") == []
    for path in (HELPER, SUDOERS, RULES, UNIT):
        assert not (box.root / path).exists(), path


# ---- the rules ----------------------------------------------------------------------------------


def test_a_compute_node_lets_only_root_reach_imds_on_both_addresses(box):
    succeeded(imds_access(box))
    for tool, address in (("iptables", "169.254.169.254/32"), ("ip6tables", "fd00:ec2::254/128")):
        calls = xtables_calls(box, tool)
        # The first run makes the chain, fills it, and inserts the jump first in OUTPUT.
        assert f"{tool} -w -N {CHAIN}" in calls
        start = calls.index(f"{tool} -w -F {CHAIN}")
        assert calls[start : start + 5] == chain_rules(tool, address, (0, "root"))[1:6]
        assert calls[-1] == f"{tool} -w -I OUTPUT 1 -d {address} -j {CHAIN}"
        assert (box.state / tool / "output").read_text() == f"-d {address} -j {CHAIN}\n"


def test_a_second_run_issues_the_same_rules_and_inserts_the_jump_once(box):
    succeeded(imds_access(box))
    first = {tool: len(xtables_calls(box, tool)) for tool in ("iptables", "ip6tables")}
    second = succeeded(imds_access(box))
    for tool, address in (("iptables", "169.254.169.254/32"), ("ip6tables", "fd00:ec2::254/128")):
        again = xtables_calls(box, tool)[first[tool] :]
        if tool == "ip6tables":
            assert again[0] == "ip6tables -w -n -L OUTPUT"  # is IPv6 there
            again = again[1:]
        assert again == chain_rules(tool, address, (0, "root"))
        assert sum(line.startswith(f"{tool} -w -I OUTPUT") for line in xtables_calls(box, tool)) == 1
        assert sum(line == f"{tool} -w -N {CHAIN}" for line in xtables_calls(box, tool)) == 1
        assert (box.state / tool / "output").read_text() == f"-d {address} -j {CHAIN}\n"
        assert f"{tool}: OUTPUT already jumps to {CHAIN} for {address}" in second.stdout


def test_the_controller_also_lets_the_prometheus_agent_through(tmp_path):
    box = make_box(tmp_path, instance_id=CONTROLLER)
    result = succeeded(imds_access(box))
    start = xtables_calls(box, "iptables").index(f"iptables -w -F {CHAIN}")
    assert (
        xtables_calls(box, "iptables")[start + 1 : start + 3]
        == chain_rules("iptables", "169.254.169.254/32", (0, "root"), (65534, "prometheus-agent"))[2:4]
    )
    assert f"iptables: {CHAIN} lets uids 0 65534 reach 169.254.169.254/32 and refuses every other" in result.stdout


def test_a_login_node_lets_only_root_through(tmp_path):
    box = make_box(tmp_path, instance_id=LOGIN)
    result = succeeded(imds_access(box))
    assert f"iptables: {CHAIN} lets uids 0 reach 169.254.169.254/32 and refuses every other" in result.stdout
    assert not [line for line in box.calls("iptables") if "--uid-owner 65534" in line]


def parallelcluster_box(base: Path, passwd: str) -> Sandbox:
    """A ParallelCluster compute node of a cluster with teams (no resource_config.json), whose passwd is ``passwd``."""
    box = make_box(base, params=TEAMS_PARAMS | {"cluster_manager": "parallelcluster"})
    (box.root / "opt/ml/config/resource_config.json").unlink()
    box.write("etc/passwd", passwd)
    return box


def test_a_parallelcluster_node_also_lets_its_admin_and_default_users_through(tmp_path):
    passwd = "root:x:0:0::/root:/bin/bash\npcluster-admin:x:400:400::/home/pcluster-admin:/bin/bash\n"
    box = parallelcluster_box(tmp_path, passwd + "ubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n")
    result = succeeded(imds_access(box, MOE_LC_NODE_GROUP="gpu"))
    start = xtables_calls(box, "iptables").index(f"iptables -w -F {CHAIN}")
    allowed = ((0, "root"), (400, "pcluster-admin (ParallelCluster)"), (1000, "ubuntu (ParallelCluster)"))
    assert (
        xtables_calls(box, "iptables")[start : start + 4]
        == chain_rules("iptables", "169.254.169.254/32", *allowed)[1:5]
    )
    assert f"iptables: {CHAIN} lets uids 0 400 1000 reach 169.254.169.254/32 and refuses every other" in result.stdout


def test_a_parallelcluster_node_without_those_users_says_so_and_lets_root_through(tmp_path):
    box = parallelcluster_box(tmp_path, "root:x:0:0::/root:/bin/bash\n")
    result = succeeded(imds_access(box, MOE_LC_NODE_GROUP="gpu"))
    assert "no user pcluster-admin on this ParallelCluster node: not in the IMDS allow list" in result.stderr
    assert f"iptables: {CHAIN} lets uids 0 reach 169.254.169.254/32 and refuses every other" in result.stdout


def test_without_ipv6_only_the_ipv4_address_is_closed(box):
    result = succeeded(imds_access(box, MOE_STUB_NO_IPV6="1"))
    assert xtables_calls(box, "ip6tables") == ["ip6tables -w -n -L OUTPUT"]
    assert xtables_calls(box, "iptables")[-1] == f"iptables -w -I OUTPUT 1 -d 169.254.169.254/32 -j {CHAIN}"
    assert "ip6tables: not installed or no IPv6 tables in this kernel; IMDS's IPv6 address left alone" in result.stdout


def test_the_boot_unit_runs_the_same_rules_without_the_lifecycle_folder(box):
    succeeded(imds_access(box))
    unit = box.read(UNIT)
    assert "ExecStart=/usr/local/sbin/moe-cdk-imds-rules\n" in unit and "Before=network-pre.target" in unit
    assert "WantedBy=multi-user.target" in unit
    assert box.calls("systemctl") == ["systemctl daemon-reload", "systemctl enable moe-cdk-imds.service"]
    rules = box.root / RULES
    assert stat.S_IMODE(rules.stat().st_mode) == 0o755 and rules.stat().st_uid == 0
    # At boot the lifecycle folder is gone: the program needs nothing of it.
    shutil.rmtree(box.lc)
    before = len(box.calls("iptables"))
    done = subprocess.run(
        ["bash", str(rules)],
        env={
            "PATH": f"{box.bin}:/usr/bin:/bin",
            "MOE_STUB_CALLS": str(box.state / "calls.log"),
            "MOE_STUB_STATE": str(box.state),
        },
        capture_output=True,
        text=True,
        check=True,
    )
    assert xtables_calls(box, "iptables")[before:] == chain_rules("iptables", "169.254.169.254/32", (0, "root"))
    assert "iptables: OUTPUT already jumps to" in done.stdout


def test_a_second_run_leaves_the_installed_files_and_units_alone(box):
    succeeded(imds_access(box))
    second = succeeded(imds_access(box))
    assert box.calls("systemctl") == ["systemctl daemon-reload", "systemctl enable moe-cdk-imds.service"]
    assert "/usr/local/bin/moe-ecr-password is already up to date" in second.stdout
    assert f"{box.root}/{SUDOERS} is already up to date" in second.stdout


# ---- the ECR helper -----------------------------------------------------------------------------


def test_the_helper_and_its_sudoers_drop_in_are_roots(box):
    succeeded(imds_access(box))
    for path, mode in ((HELPER, 0o755), (SUDOERS, 0o440)):
        info = (box.root / path).stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, 0, 0), path
    lines = [line for line in box.read(SUDOERS).splitlines() if line and not line.startswith("#")]
    assert lines == ["ALL ALL=(root) NOPASSWD: /usr/local/bin/moe-ecr-password"]
    # No temporary file left beside it (sudo would skip one with a dot, but none should stay).
    assert sorted(p.name for p in (box.root / "etc/sudoers.d").iterdir()) == ["moe-cdk-ecr"]


def test_the_helper_prints_the_ecr_token_from_the_cli_with_none_of_the_callers_environment(box):
    # The AWS CLI the helper names (found on the lifecycle's PATH when it was installed) reports what it was given.
    seen = box.base / "aws-seen"
    (box.bin / "aws").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$*" >{seen}\nenv | sort >>{seen}\n'
        '[ "$*" = "ecr get-login-password --region us-east-2" ] && echo tok3n\n'
    )
    succeeded(imds_access(box))
    helper = str(box.root / HELPER)
    env = {
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_CONFIG_FILE": "/tmp/theirs",
        "HOME": "/home/x",
    }
    done = subprocess.run([helper, "us-east-2"], env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "tok3n\n"), done.stderr
    args, *environment = seen.read_text().splitlines()
    assert args == "ecr get-login-password --region us-east-2"
    assert not [line for line in environment if line.startswith("AWS_")]
    assert "HOME=/root" in environment
    seen.unlink()
    for bad in (["us-east-2; id"], ["--profile", "x"], []):
        done = subprocess.run([helper, *bad], env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 2 and "usage: moe-ecr-password REGION" in done.stderr, bad
        assert not seen.exists(), bad


def test_a_drop_in_visudo_rejects_is_not_installed(box):
    stub(box, "visudo", 'exit "${MOE_STUB_VISUDO_RC:-0}"\n')
    result = imds_access(box, MOE_STUB_VISUDO_RC="1")
    assert result.returncode != 0
    assert "visudo rejects the sudoers drop-in for moe-ecr-password" in result.stdout + result.stderr
    assert not (box.root / "etc/sudoers.d").exists() or not list((box.root / "etc/sudoers.d").iterdir())
    # And the members are not refused IMDS before their pulls have the helper to turn to.
    assert box.calls("iptables") == []
    succeeded(imds_access(box))
    (check,) = box.calls("visudo")[-1:]
    assert check.startswith(f"visudo -cf {box.root}/{SUDOERS}.moe-cdk.")


@pytest.mark.skipif(shutil.which("visudo") is None, reason="visudo is not installed here (sudo's package has it)")
def test_sudo_parses_the_drop_in(box):
    succeeded(imds_access(box))
    done = subprocess.run(["visudo", "-cf", str(box.root / SUDOERS)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- on_create.sh -------------------------------------------------------------------------------


def test_on_create_closes_imds_after_the_teams_step(tmp_path):
    # The teams step makes the members' users (in the sandbox's own passwd) and their homes, written as the member,
    # so the sandbox lives in a folder the member may walk through (as in test_teams_homes.py).
    base = Path(tempfile.mkdtemp(prefix="moeci-imds-"))
    base.chmod(0o755)
    try:
        box = make_box(base)
        box.copy_system_accounts()
        (box.root / "fsx").mkdir(mode=0o755)
        result = succeeded(box.on_create())
        steps = [r["step"] for r in box.records(result)]
        assert steps[steps.index("teams") :] == ["teams", "imds_access", "observability"]
        assert xtables_calls(box, "iptables")[-1] == f"iptables -w -I OUTPUT 1 -d 169.254.169.254/32 -j {CHAIN}"
        assert "\ncarol:x:2301:" in box.read("etc/passwd")
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- the real rules, in a network namespace -----------------------------------------------------

# Run inside `unshare --net`: IMDS's addresses on the namespace's loopback with an HTTP server on each, the script
# (with the sandbox's stand-ins for everything but iptables and ip6tables), then one request per address as root and
# as nobody. The client binds to an address of the node's (--interface): with IMDS's own address as its source, the
# REJECT's answer would be addressed to IMDS too, and be refused in turn. `probe` prints "WHO FAMILY RESULT" lines.
NAMESPACE_SCRIPT = r"""
set -euo pipefail
"$IP" link set lo up
"$IP" addr add 10.0.64.11/32 dev lo
"$IP" addr add 169.254.169.254/32 dev lo
v6=0
if "$IP" -6 addr add fd00::11/128 dev lo nodad 2>/dev/null && "$IP" -6 addr add fd00:ec2::254/128 dev lo nodad \
  && ip6tables -w -n -L OUTPUT >/dev/null 2>&1; then
  v6=1
fi
"$PYTHON" -m http.server 80 --bind 169.254.169.254 --directory "$WWW" >/dev/null 2>&1 &
[ "$v6" = 1 ] && { "$PYTHON" -m http.server 80 --bind fd00:ec2::254 --directory "$WWW" >/dev/null 2>&1 & }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
for _ in $(seq 50); do "$CURL" -sf -o /dev/null http://169.254.169.254/ && break; sleep 0.1; done
[ "$v6" = 1 ] && for _ in $(seq 50); do "$CURL" -sf -o /dev/null 'http://[fd00:ec2::254]/' && break; sleep 0.1; done
get=("$CURL" -s -o /dev/null -w '%{http_code}' --max-time 5)
probe() {
  local who="$1" code
  shift
  code="$("$@" "${get[@]}" --interface 10.0.64.11 http://169.254.169.254/)" || code="$code/exit$?"
  echo "$who v4 $code"
  if [ "$v6" = 1 ]; then
    code="$("$@" "${get[@]}" --interface fd00::11 'http://[fd00:ec2::254]/')" || code="$code/exit$?"
    echo "$who v6 $code"
  fi
}
as() { setpriv --reuid="$1" --regid="$1" --clear-groups "${@:2}"; }
probe before-root env
probe before-nobody as 65534
bash "$LC/imds_access.sh" >"$OUT/run1.log"
bash "$LC/imds_access.sh" >"$OUT/run2.log"
iptables -w -S >"$OUT/iptables.txt"
[ "$v6" = 1 ] && ip6tables -w -S >"$OUT/ip6tables.txt"
probe compute-root env
probe compute-nobody as 65534
# The same node as the controller: the chain is refilled with the Prometheus agent's uid.
echo "$CONTROLLER_ID" >"$MOE_LC_ROOT/sys/devices/virtual/dmi/id/board_asset_tag"
bash "$LC/imds_access.sh" >"$OUT/run3.log"
iptables -w -S >"$OUT/iptables-controller.txt"
probe controller-root env
probe controller-nobody as 65534
probe controller-65533 as 65533
"""


def namespace_unavailable() -> str | None:
    """Why the real rules cannot be tried here, or None."""
    for tool in ("unshare", "iptables", "ip6tables", "ip", "curl", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the Makefile's system-packages installs iptables)"
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", f"iptables -w -n -L OUTPUT && iptables -w -N {CHAIN}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"iptables cannot be used in a network namespace here: {(done.stderr or done.stdout).strip()}"
    return None


def test_in_a_network_namespace_root_reaches_imds_and_nobody_is_refused(tmp_path):
    reason = namespace_unavailable()
    if reason:
        pytest.skip(reason)
    box = make_box(tmp_path)
    for name in ("iptables", "ip6tables", "ip"):
        (box.bin / name).unlink()  # the real ones
    out = tmp_path / "out"
    out.mkdir()
    www = tmp_path / "www"
    www.mkdir()
    env = box.env(
        IP=shutil.which("ip"),
        CURL=shutil.which("curl"),
        PYTHON=sys.executable,
        WWW=str(www),
        OUT=str(out),
        LC=str(box.lc),
        CONTROLLER_ID=CONTROLLER,
    )
    assert shutil.which("iptables", path=env["PATH"]) not in (None, str(box.bin / "iptables"))
    done = subprocess.run(
        ["unshare", "--net", "bash", "-c", NAMESPACE_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    families = ["v4", "v6"] if "before-root v6" in results else ["v4"]
    refused = "000/exit7"  # curl: "Failed to connect" (the REJECT's answer), at once
    for family in families:
        assert results[f"before-root {family}"] == results[f"before-nobody {family}"] == "200", results
        assert results[f"compute-root {family}"] == "200", results
        assert results[f"compute-nobody {family}"] == refused, results
        assert results[f"controller-root {family}"] == results[f"controller-nobody {family}"] == "200", results
        assert results[f"controller-65533 {family}"] == refused, results
    # Two runs, one jump; the chain as the header of imds_access.sh gives it.
    rules = (out / "iptables.txt").read_text().splitlines()
    assert rules.count(f"-A OUTPUT -d 169.254.169.254/32 -j {CHAIN}") == 1
    assert [line for line in rules if line.startswith(f"-A {CHAIN}")] == [
        f'-A {CHAIN} -m owner --uid-owner 0 -m comment --comment "moe-cdk: root" -j RETURN',
        f'-A {CHAIN} -m limit --limit 6/min -m comment --comment "moe-cdk: log the refused" '
        f'-j LOG --log-prefix "moe-cdk IMDS refused: " --log-uid',
        f'-A {CHAIN} -m comment --comment "moe-cdk: everyone else" -j REJECT --reject-with icmp-port-unreachable',
    ]
    if "v6" in families:
        assert (out / "ip6tables.txt").read_text().splitlines().count(f"-A OUTPUT -d fd00:ec2::254/128 -j {CHAIN}") == 1
    controller = (out / "iptables-controller.txt").read_text().splitlines()
    assert controller.count(f"-A OUTPUT -d 169.254.169.254/32 -j {CHAIN}") == 1
    assert (
        f'-A {CHAIN} -m owner --uid-owner 65534 -m comment --comment "moe-cdk: prometheus-agent" -j RETURN'
        in controller
    )
