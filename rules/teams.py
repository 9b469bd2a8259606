"""Teams sharing one cluster: QoS tiers with priorities and preemption, teams with members, shares and borrowing,
the same for both orchestrators. On Slurm they become accounts, users, associations, QoS and fair-share
(``sacctmgr``, lifecycle_scripts/slurm_teams.py); on HyperPod EKS, task governance's priority classes, fair share and
one compute quota per team (constructs/hyperpod_eks_cluster.py), and the queue labels on each job.

Sources (read 2026-12-04):

- [QOS] AWS's "Fair-share, QoS, Priority & Preemption" guide (awslabs/ai-on-sagemaker-hyperpod,
  website/docs/01-slurm-orchestration/add-ons/slurm-chargeback/03-qos-priority-preemption.md at a1d1d75): accounts
  with ``FairShare=``, QoS tiers with ``Priority=``, ``MaxTRES=gres/gpu=N``, ``MaxWall=`` and ``Preempt=``;
  ``PriorityType=priority/multifactor``, ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``.
- [USERS] aws-samples/awsome-distributed-training base-config (add_users.sh, shared_users_sample.txt at 0edaf15):
  one user a line, ``name,uid,/fsx/name``; homes on FSx.
- [TG] the CloudFormation registry schemas of ``AWS::SageMaker::ClusterSchedulerConfig`` and
  ``AWS::SageMaker::ComputeQuota`` (cfn-lint 1.58): at most 10 priority classes, weights 0 to 100; team and
  priority-class names ``^[a-z0-9]([-a-z0-9]*[a-z0-9]){0,39}?$``; ``FairShareWeight`` 0 to 100; sharing
  ``Lend``, ``DontLend`` or ``LendAndBorrow`` with ``BorrowLimit`` (percent; 1 to 500 in the SageMaker guide).
- [TG-LABELS] aws/sagemaker-hyperpod-cli at 011ca92: a team's namespace is ``hyperpod-ns-<team>``, its queue
  ``hyperpod-ns-<team>-localqueue``; jobs carry ``kueue.x-k8s.io/queue-name`` and
  ``kueue.x-k8s.io/priority-class: <class>-priority``. Kubernetes label values are at most 63 characters, so a team
  name is at most 40 (the queue's name) and a class name at most 54.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import ConfigError, Problem, problem

Problems = Iterator[Problem]

# [TG] names, with the label-length bounds of [TG-LABELS].
TEAM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
QOS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,52}[a-z0-9])?$")
# A POSIX login name as useradd (shadow-utils' default NAME_REGEX) takes it, at most 32 characters.
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
FIRST_TEAM_GID = 60001  # above every member's uid (and so the gid of the member's own group)
LAST_TEAM_GID = 61183  # below the systemd dynamic range (61184-65519)
TEAMS_FOLDER = "/fsx/teams"
"""Where each team's private folder is on Slurm: /fsx/teams/<team>, the team's checkpoints and profiles."""
OPERATORS_ACCOUNT = "operators"
"""The Slurm account of the operators (``TeamsConfig.operators``) and root."""
MAX_PRIORITY_CLASSES = 10  # [TG]
MAX_BORROW_PERCENT = 500  # [TG], the SageMaker guide's range
FIRST_USER_UID = 2000  # above the AMI's own users (ubuntu is 1000); AWS's sample starts at 2001 [USERS]
LAST_USER_UID = 59999  # below nobody's 65534 and the systemd dynamic range (61184-65519)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def team_namespace(team: str) -> str:
    """The namespace task governance creates for ``team`` [TG-LABELS]."""
    return f"hyperpod-ns-{team}"


def queue_name(team: str) -> str:
    return f"{team_namespace(team)}-localqueue"


def priority_class(qos: str) -> str:
    return f"{qos}-priority"


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class QosTier:
    """A quality of service: a Slurm QoS and a task-governance priority class of the same name."""

    name: str
    """Lowercase letters, digits and inner hyphens, at most 54 characters."""
    priority: int
    """Relative priority, 0 to 100 (Slurm `Priority=`, task governance's class weight)."""
    preempts: tuple[str, ...] = ()
    """Lower tiers whose jobs this tier's jobs may preempt: they are requeued and resume from their checkpoint."""
    max_gpus: int | None = None
    """Most GPUs one job of this tier may hold (Slurm `MaxTRES=gres/gpu=N`). Default: no limit."""
    max_wall: str | None = None
    """Longest run of one job, in Slurm's time format (`MaxWall=`), e.g. `2-00:00:00`. Default: the partition's."""
    grace_time_s: int = 300
    """When a job of this tier is preempted: seconds it gets to save a checkpoint and stop before it is requeued
    (Slurm `GraceTime=`; the job is sent its `--signal`, USR1, at once). It must cover a step and a save. 0 to
    3600."""


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class TeamMember:
    """A user who logs in and submits jobs."""

    name: str
    """POSIX login name."""
    uid: int
    """The same user id on every node, 2000 to 59999; the home is `/fsx/<name>`."""


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class Team:
    """A team: a Slurm account and a task-governance team of the same name."""

    name: str
    """Lowercase letters, digits and inner hyphens, at most 40 characters."""
    share_percent: int
    """The team's share of the compute, 1 to 100 (Slurm `FairShare=`; on EKS its quota of each compute group's nodes
    and its fair-share weight). The teams' shares add up to at most 100."""
    members: tuple[TeamMember, ...] = ()
    """Users of this team; a user is in one team only."""
    qos: tuple[str, ...] = ()
    """The QoS tiers the team may use. Default: every tier."""
    default_qos: str | None = None
    """The tier a job gets without `--qos`. Default: the lowest of `qos`."""
    lend: bool = True
    """Lend the team's idle quota to other teams (EKS)."""
    borrow_percent: int = 0
    """How much above its quota the team may borrow from idle quotas, in percent of it (EKS), 0 to 500."""
    gid: int | None = None
    """The team's POSIX group on Slurm nodes (named as the team), which owns the team's folder /fsx/teams/<name>
    (mode 2770: only the team's members read and write there). 60001 to 61183, above the members' uids. Default:
    60001 + the team's place in `teams`; set it to keep a team's group when teams are reordered."""

    def group_id(self, position: int) -> int:
        """The team's gid: ``gid``, else the default for the team at ``position`` in ``teams``."""
        return self.gid if self.gid is not None else FIRST_TEAM_GID + position

    def tiers(self, every: tuple[QosTier, ...]) -> tuple[str, ...]:
        return self.qos or tuple(t.name for t in every)

    def default(self, every: tuple[QosTier, ...]) -> str | None:
        """The default tier: the one named, else the lowest-priority tier the team may use."""
        allowed = [t for t in every if t.name in self.tiers(every)]
        return self.default_qos or (min(allowed, key=lambda t: t.priority).name if allowed else None)

    @property
    def sharing(self) -> str:
        """Task governance's sharing strategy."""
        if self.borrow_percent:
            return "LendAndBorrow"
        return "Lend" if self.lend else "DontLend"


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class TeamsConfig:
    """Teams sharing the cluster, and the QoS tiers their jobs run at. Without it, one team runs with no setup."""

    qos: tuple[QosTier, ...] = ()
    """The QoS tiers, at most 10."""
    teams: tuple[Team, ...] = ()
    """The teams."""
    operators: tuple[str, ...] = ("ubuntu",)
    """Users outside the teams who keep submitting jobs without `--account` once accounting is enforced: the
    cluster's default user (`ubuntu` on HyperPod's AMI), and the admins. On Slurm they get the `operators` account
    (the lowest share, every tier, the lowest tier by default); root always does. Default: ubuntu."""

    def problems(self) -> Problems:
        tiers = {t.name: t for t in self.qos}
        for key, names in (("qos", [t.name for t in self.qos]), ("teams", [t.name for t in self.teams])):
            for name, count in Counter(names).items():
                if count > 1:
                    yield problem("named twice", got=name, allowed="unique names").at(key)
        if len(self.qos) > MAX_PRIORITY_CLASSES:
            yield problem("too many tiers", got=len(self.qos), allowed=f"at most {MAX_PRIORITY_CLASSES}").at("qos")
        for i, tier in enumerate(self.qos):
            yield from _tier_problems(tier, tiers, f"qos[{i}]")
        members: dict[str, str] = {}
        uids: dict[int, str] = {}
        for i, team in enumerate(self.teams):
            key = f"teams[{i}]"
            yield from _team_problems(team, tiers, key)
            for j, member in enumerate(team.members):
                mkey = f"{key}.members[{j}]"
                if not USER_NAME.match(member.name):
                    yield problem("not a login name", got=member.name, allowed=USER_NAME.pattern).at(f"{mkey}.name")
                if member.name in members:
                    yield problem(
                        f"already in team {members[member.name]}: a user has one default account and one namespace",
                        got=member.name,
                        allowed="each user in one team",
                    ).at(f"{mkey}.name")
                members.setdefault(member.name, team.name)
                if not FIRST_USER_UID <= member.uid <= LAST_USER_UID:
                    yield problem("out of range", got=member.uid, allowed=f"{FIRST_USER_UID} to {LAST_USER_UID}").at(
                        f"{mkey}.uid"
                    )
                elif uids.setdefault(member.uid, member.name) != member.name:
                    yield problem(f"already {uids[member.uid]}'s", got=member.uid, allowed="a uid per user").at(
                        f"{mkey}.uid"
                    )
        total = sum(t.share_percent for t in self.teams)
        if total > 100:
            yield problem(
                "the teams' shares add up to more than the cluster",
                got=f"{total}% ({', '.join(f'{t.name} {t.share_percent}' for t in self.teams)})",
                allowed="at most 100% in all",
            ).at("teams")
        if self.teams and not self.qos:
            yield problem("teams need at least one QoS tier", got=[], allowed="one or more tiers").at("qos")
        gids: dict[int, str] = {}
        for i, team in enumerate(self.teams):
            gid = team.group_id(i)
            if not FIRST_TEAM_GID <= gid <= LAST_TEAM_GID:
                yield problem("out of range", got=gid, allowed=f"{FIRST_TEAM_GID} to {LAST_TEAM_GID}").at(
                    f"teams[{i}].gid"
                )
            elif gids.setdefault(gid, team.name) != team.name:
                yield problem(f"already team {gids[gid]}'s", got=gid, allowed="a gid per team").at(f"teams[{i}].gid")
            if len(team.name) > 32:
                yield problem(
                    "longer than a POSIX group name, which Slurm nodes make of it", got=team.name, allowed="32 at most"
                ).at(f"teams[{i}].name")
            if team.name in members:
                yield problem(
                    "also a member's name: the member's own group has it", got=team.name, allowed="another name"
                ).at(f"teams[{i}].name")
        for i, name in enumerate(self.operators):
            if not USER_NAME.match(name):
                yield problem("not a login name", got=name, allowed=USER_NAME.pattern).at(f"operators[{i}]")
            elif name in members:
                yield problem(
                    f"a member of team {members[name]}: a user has one default account",
                    got=name,
                    allowed="a user outside the teams",
                ).at(f"operators[{i}]")
        if any(t.name == OPERATORS_ACCOUNT for t in self.teams):
            yield problem("the name of the operators' account", got=OPERATORS_ACCOUNT, allowed="another team name").at(
                "teams"
            )


def job_team(teams: TeamsConfig | None, team: str | None, qos: str | None) -> tuple[str | None, str | None]:
    """The team and QoS tier a job runs as (``--team``, ``--qos``): the QoS defaults to the team's default tier.
    Raises ``ConfigError`` naming the option for a team or tier the configuration does not have, or that the team
    may not use."""
    found: list[Problem] = []
    tiers = [t.name for t in teams.qos] if teams else []
    chosen = None
    if team is not None:
        chosen = next((t for t in teams.teams if t.name == team), None) if teams else None
        if chosen is None:
            allowed = ", ".join(t.name for t in teams.teams) if teams and teams.teams else "none: no teams section"
            found.append(problem("no such team in the configuration", got=team, allowed=allowed).at("--team"))
    if qos is not None and teams is not None:
        allowed = list(chosen.tiers(teams.qos)) if chosen else tiers
        if qos not in allowed:
            who = f"team {chosen.name}'s tiers" if chosen else "the configuration's tiers"
            found.append(problem(f"not one of {who}", got=qos, allowed=", ".join(allowed)).at("--qos"))
    if found:
        raise ConfigError(found)
    if chosen is not None and qos is None:
        qos = chosen.default(teams.qos)
    return team, qos


def _tier_problems(tier: QosTier, tiers: dict[str, QosTier], key: str) -> Problems:
    if not QOS_NAME.match(tier.name):
        yield problem(
            "not a QoS name", got=tier.name, allowed="lowercase letters, digits and inner hyphens, at most 54"
        ).at(f"{key}.name")
    if not 0 <= tier.priority <= 100:
        yield problem("out of range", got=tier.priority, allowed="0 to 100").at(f"{key}.priority")
    for other in tier.preempts:
        if other not in tiers:
            yield problem("no such QoS tier", got=other, allowed=", ".join(tiers) or "a tier under qos").at(
                f"{key}.preempts"
            )
        elif other == tier.name:
            yield problem("a tier cannot preempt itself", got=other, allowed="lower tiers").at(f"{key}.preempts")
        elif tiers[other].priority >= tier.priority:
            yield problem(
                f"preempts a tier of priority {tiers[other].priority}, not lower than its own {tier.priority}",
                got=other,
                allowed="tiers of lower priority",
            ).at(f"{key}.preempts")
    if not 0 <= tier.grace_time_s <= 3600:
        yield problem("out of range", got=tier.grace_time_s, allowed="0 to 3600 seconds").at(f"{key}.grace_time_s")
    if tier.max_gpus is not None and tier.max_gpus < 1:
        yield problem("must be positive", got=tier.max_gpus, allowed="1 or more, or null").at(f"{key}.max_gpus")
    if tier.max_wall is not None and not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", tier.max_wall):
        yield problem("not a Slurm time", got=tier.max_wall, allowed="e.g. 04:00:00 or 2-00:00:00").at(
            f"{key}.max_wall"
        )


def _team_problems(team: Team, tiers: dict[str, QosTier], key: str) -> Problems:
    if not TEAM_NAME.match(team.name):
        yield problem(
            "not a team name", got=team.name, allowed="lowercase letters, digits and inner hyphens, at most 40"
        ).at(f"{key}.name")
    if not 1 <= team.share_percent <= 100:
        yield problem("out of range", got=team.share_percent, allowed="1 to 100").at(f"{key}.share_percent")
    for name in team.qos:
        if name not in tiers:
            yield problem("no such QoS tier", got=name, allowed=", ".join(tiers) or "a tier under qos").at(f"{key}.qos")
    allowed = team.qos or tuple(tiers)
    if team.default_qos is not None and team.default_qos not in allowed:
        yield problem("not one of the team's tiers", got=team.default_qos, allowed=", ".join(allowed)).at(
            f"{key}.default_qos"
        )
    if not 0 <= team.borrow_percent <= MAX_BORROW_PERCENT:
        yield problem("out of range", got=team.borrow_percent, allowed=f"0 to {MAX_BORROW_PERCENT}").at(
            f"{key}.borrow_percent"
        )
    elif team.borrow_percent and not team.lend:
        yield problem(
            "a team that borrows idle quota also lends its own (task governance's LendAndBorrow)",
            got="lend: false",
            allowed="lend: true, or borrow_percent: 0",
        ).at(f"{key}.lend")


__all__ = [
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "QosTier",
    "Team",
    "TeamMember",
    "TeamsConfig",
    "job_team",
    "priority_class",
    "queue_name",
    "team_namespace",
]
