#!/usr/bin/env python3
"""slurm_teams.py: the `teams` of provisioning_parameters.json as Slurm accounting, run by slurm_teams.sh.

    slurm_teams.py names PARAMS         print the teams' names (none: the step has nothing to do)
    slurm_teams.py members PARAMS       print "name uid" for each team member (every node creates the users)
    slurm_teams.py groups PARAMS        print "team gid member,member" for each team (its group and folder)
    slurm_teams.py apply PARAMS         (controller) QoS tiers, team accounts and their users with sacctmgr
    slurm_teams.py conf PARAMS          print the scheduler settings that priority and preemption need

`apply` is idempotent: what exists is modified to the parameters' values, what is missing is added, a limit taken
out of the parameters is cleared (-1), nothing else is removed (a user taken out of a team keeps the association
until `sacctmgr delete user`). It follows AWS's "Fair-share, QoS, Priority & Preemption" guide
(awslabs/ai-on-sagemaker-hyperpod at a1d1d75, website/docs/01-slurm-orchestration/add-ons/slurm-chargeback/
03-qos-priority-preemption.md): accounts with FairShare=, GrpTRES=gres/gpu=N and MaxJobs=; QoS tiers with
Priority=, Preempt=, MaxTRES=gres/gpu=N, MaxTRESPerUser=gres/gpu=N and MaxWall=; users with DefaultAccount=.
sacctmgr(1) of Slurm 22.05 for the syntax (-i commits without a prompt; -n -P print bare, |-separated rows; -1
clears a limit) and for which entity takes which option: MaxTRESPerUser and PreemptExemptTime are QoS options only,
so a team's per-member GPU cap is GrpTRES on each member's own association.

Python 3 standard library only, like node_info.py: it runs on the node's own interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

# The scheduler settings of AWS's guide (03-qos-priority-preemption.md at a1d1d75, "Multi-Factor Priority" and
# "Preemption"), as it writes them: fair share weighs twice what QoS does (5000 to 2500), usage is reset monthly, and
# preemption goes by QoS with requeue; AccountingStorageEnforce makes a job's account, QoS and limits count. The
# guide's global PreemptExemptTime=00:30:00 is set on each tier instead (QoS PreemptExemptTime, preempt_exempt_s):
# sacctmgr(1) of 22.05 says the QoS's value "takes precedence over the global PreemptExemptTime", it lives in the
# accounting database, where no rewrite of slurm.conf reaches it, and a change to it needs no slurmctld restart.
SCHEDULER_SETTINGS = (
    "PriorityType=priority/multifactor",
    "PriorityDecayHalfLife=7-0",
    "PriorityCalcPeriod=5",
    "PriorityMaxAge=7-0",
    "PriorityUsageResetPeriod=MONTHLY",
    "PriorityWeightAge=1000",
    "PriorityWeightFairshare=5000",
    "PriorityWeightJobSize=500",
    "PriorityWeightPartition=1000",
    "PriorityWeightQOS=2500",
    "PriorityFavorSmall=NO",
    "PreemptType=preempt/qos",
    "PreemptMode=REQUEUE",
    "AccountingStorageEnforce=associations,limits,qos",
)
# At preemption, send the job its own --signal (the batch scripts' B:USR1: save a checkpoint, stop, requeue), and
# requeue it only after its QoS's GraceTime. Without this the job's steps are ended at once and a rank dies in the
# middle of a collective: measured on Slurm 22.05, the preempted run lost the step it was in
# (tests/lifecycle_scripts/test_teams_slurm.py). Slurm 23.02 moved the flag from SchedulerParameters
# (preempt_send_user_signal, slurm.conf(5) of 22.05) to PreemptParameters (send_user_signal); HyperPod's Slurm
# version is not published, so the running one decides.
SEND_USER_SIGNAL = {"old": ("SchedulerParameters", "preempt_send_user_signal"), "new": ("PreemptParameters", "send_user_signal")}


def signal_setting(version: tuple[int, int], current: dict[str, str]) -> str:
    """The slurm.conf line that turns the user signal at preemption on, keeping the key's current flags."""
    key, flag = SEND_USER_SIGNAL["new" if version >= (23, 2) else "old"]
    flags = [f for f in current.get(key, "").split(",") if f and f != "(null)"]
    return f"{key}={','.join(flags if flag in flags else [*flags, flag])}"


def running_slurm() -> tuple[tuple[int, int], dict[str, str]]:
    """The running Slurm's version (``scontrol --version``: "slurm 22.05.8") and configuration (``scontrol show
    config``: "Key = value" lines)."""
    version = subprocess.run(["scontrol", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    major, minor = (int(part) for part in version.split(".")[:2])
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    current = {k.strip(): v.strip() for k, sep, v in (line.partition("=") for line in shown.splitlines()) if sep}
    return (major, minor), current


def teams_of(params_path: str) -> dict:
    with open(params_path, encoding="utf-8") as handle:
        return json.load(handle).get("teams") or {"qos": [], "teams": []}


def count(value: object, what: str) -> int:
    """A whole number of the parameters (a limit, seconds): JSON's true is not one, and a string never reaches
    sacctmgr."""
    if type(value) is not int or value < 0:
        raise SystemExit(f"{what}: not a whole number: {value!r}")
    return value


def duration(seconds: int) -> str:
    """Seconds in Slurm's [days-]hours:minutes:seconds: sacctmgr reads a bare number as minutes (PreemptExemptTime=20
    is shown as 00:20:00 on 22.05)."""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def gpu_limit(value: object, what: str, gpus_tracked: bool) -> list[str]:
    """``gres/gpu=N``, or ``gres/gpu=-1`` (cleared) for no limit; nothing where GPUs are not tracked, where sacctmgr
    can neither set nor clear one. A limit asked for there stops the step."""
    if value is not None and not gpus_tracked:
        raise SystemExit(
            f"{what} needs GPU accounting (AccountingStorageTRES=gres/gpu), which this cluster's accounting does not "
            "track"
        )
    return [f"gres/gpu={-1 if value is None else count(value, what)}"] if gpus_tracked else []


def sacctmgr(*args: str) -> str:
    done = subprocess.run(["sacctmgr", "-i", "-n", "-P", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"sacctmgr {' '.join(args)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


def names(entity: str, *where: str) -> set[str]:
    field = {"qos": "name", "account": "account", "assoc": "user"}[entity]
    return {line.strip() for line in sacctmgr("show", entity, *where, f"format={field}").splitlines() if line.strip()}


def apply(teams: dict) -> None:
    # HyperPod's accounting tracks GPUs (AccountingStorageTRES=gres/gpu, base-config setup_mariadb_accounting.sh);
    # a GPU limit can be set, or cleared, only where that TRES exists (sacctmgr: "no TRES known by type gres/gpu").
    gpus_tracked = "gres/gpu" in sacctmgr("show", "tres", "format=type,name").replace("|", "/")
    qos = names("qos")
    for tier in teams["qos"]:
        if tier["name"] not in qos:
            sacctmgr("add", "qos", tier["name"])
            print(f"added QoS {tier['name']}")
    # Every tier first, then preempt lists and limits, which may name other tiers. A preempt list is set only when
    # it differs: Slurm 22.05 answers "QOS Preemption loop detected" to setting a tier's list to the one it has.
    preempts = {
        name: set(filter(None, current.split(",")))
        for name, current in (line.split("|", 1) for line in sacctmgr("show", "qos", "format=name,preempt").splitlines())
    }
    for tier in teams["qos"]:
        wanted = tier.get("preempts") or []
        where = f"QoS {tier['name']}"
        exempt = tier.get("preempt_exempt_s")
        settings = [
            f"Priority={tier['priority']}",
            *(["Preempt=" + ",".join(wanted)] if set(wanted) != preempts.get(tier["name"], set()) else []),
            f"MaxWall={tier['max_wall']}" if tier.get("max_wall") else "MaxWall=-1",
            f"GraceTime={tier.get('grace_time_s', 0)}",
            # -1: the global PreemptExemptTime (none is set), for parameters written before the setting existed.
            "PreemptExemptTime=" + ("-1" if exempt is None else duration(count(exempt, f"{where}: preempt_exempt_s"))),
            *("MaxTRES=" + t for t in gpu_limit(tier.get("max_gpus"), f"{where}: max_gpus", gpus_tracked)),
            *(
                "MaxTRESPerUser=" + t
                for t in gpu_limit(tier.get("max_gpus_per_user"), f"{where}: max_gpus_per_user", gpus_tracked)
            ),
        ]
        modify("qos", tier["name"], settings)
    accounts = names("account")
    for team in teams["teams"]:
        if team["name"] not in accounts:
            sacctmgr("add", "account", f"name={team['name']}", f"Description=team {team['name']}", "Organization=moe-cdk")
            print(f"added account {team['name']}")
        where = f"team {team['name']}"
        jobs = team.get("max_jobs_per_user")
        modify(
            "account",
            team["name"],
            [
                f"FairShare={team['share_percent']}",
                f"QOS={','.join(team['qos'])}",
                f"DefaultQOS={team['default_qos']}",
                # The team's GPU cap: what its running jobs hold together, members' and sub-associations' alike.
                *("GrpTRES=" + t for t in gpu_limit(team.get("max_gpus"), f"{where}: max_gpus", gpus_tracked)),
                # On an account, MaxJobs is each user's ("Maximum number of jobs each user is allowed to run at one
                # time in this association", sacctmgr(1)), inherited by the members' associations.
                "MaxJobs=" + ("-1" if jobs is None else str(count(jobs, f"{where}: max_jobs_per_user"))),
            ],
        )
        users = names("assoc", f"account={team['name']}")
        per_user = gpu_limit(team.get("max_gpus_per_user"), f"{where}: max_gpus_per_user", gpus_tracked)
        for member in team["members"]:
            if member["name"] not in users:
                sacctmgr("add", "user", f"name={member['name']}", f"account={team['name']}", f"DefaultAccount={team['name']}")
                print(f"added user {member['name']} to account {team['name']}")
            if per_user:
                # The member's own association: GrpTRES there is what that member's jobs in the team hold together.
                modify("user", member["name"], ["GrpTRES=" + per_user[0]], account=team["name"])
    operators(teams, accounts)


OPERATORS = "operators"  # rules/teams.py OPERATORS_ACCOUNT


def operators(teams: dict, accounts: set[str]) -> None:
    """The operators' account, for the users outside the teams who run the cluster: with accounting enforced, AWS's
    chargeback guide says "jobs without a valid account will be rejected", and an operator's plain sbatch (or a
    preflight job moe-cdk renders) names none. The configured operators (ubuntu by default) get it as their default
    account: the lowest share, every tier, the lowest-priority tier by default. root keeps Slurm's own root account."""
    tiers = sorted(teams["qos"], key=lambda tier: tier["priority"])
    if OPERATORS not in accounts:
        sacctmgr("add", "account", f"name={OPERATORS}", "Description=cluster operators", "Organization=moe-cdk")
        print(f"added account {OPERATORS}")
    modify("account", OPERATORS, ["FairShare=1", f"QOS={','.join(t['name'] for t in tiers)}", f"DefaultQOS={tiers[0]['name']}"])
    users = names("assoc", f"account={OPERATORS}")
    for name in teams.get("operators", ["ubuntu"]):
        if name not in users:
            sacctmgr("add", "user", f"name={name}", f"account={OPERATORS}", f"DefaultAccount={OPERATORS}")
            print(f"added user {name} to account {OPERATORS}")


def modify(entity: str, name: str, settings: list[str], *, account: str | None = None) -> None:
    # sacctmgr exits 1 with "Nothing modified" when every value is already set: that is the idempotent case.
    where = [f"name={name}", *([f"account={account}"] if account else [])]
    done = subprocess.run(
        ["sacctmgr", "-i", "modify", entity, "where", *where, "set", *settings],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 and "Nothing modified" not in done.stdout + done.stderr:
        raise SystemExit(f"sacctmgr modify {entity} {name} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    print(f"{entity} {name}{f' in account {account}' if account else ''}: {' '.join(settings)}")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("names", "members", "groups", "apply", "conf"):
        print(__doc__, file=sys.stderr)
        return 2
    teams = teams_of(argv[2])
    if argv[1] == "names":
        for team in teams["teams"]:
            print(team["name"])
    elif argv[1] == "groups":
        for team in teams["teams"]:
            print(team["name"], team["gid"], ",".join(m["name"] for m in team["members"]) or "-")
    elif argv[1] == "members":
        for team in teams["teams"]:
            for member in team["members"]:
                print(member["name"], member["uid"])
    elif argv[1] == "conf":
        print("\n".join([*SCHEDULER_SETTINGS, signal_setting(*running_slurm())]))
    else:
        apply(teams)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
