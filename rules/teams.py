"""Teams sharing one cluster: QoS tiers with priorities and preemption, teams with members, shares and borrowing,
the same for both orchestrators. On Slurm they become accounts, users, associations, QoS and fair-share
(``sacctmgr``, lifecycle_scripts/slurm_teams.py); on HyperPod EKS, task governance's priority classes, fair share and
one compute quota per team (constructs/hyperpod_eks_cluster.py), and the queue labels on each job.

Sources (read 2026-12-04):

- [QOS] AWS's "Fair-share, QoS, Priority & Preemption" guide (awslabs/ai-on-sagemaker-hyperpod,
  website/docs/01-slurm-orchestration/add-ons/slurm-chargeback/03-qos-priority-preemption.md at a1d1d75): accounts
  with ``FairShare=``, QoS tiers with ``Priority=``, ``MaxTRES=gres/gpu=N``, ``MaxTRESPerUser=gres/gpu=N``,
  ``MaxWall=`` and ``Preempt=``; accounts with ``GrpTRES=gres/gpu=N`` and ``MaxJobs=``;
  ``PriorityType=priority/multifactor``, ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``,
  ``PreemptExemptTime=00:30:00``. sacctmgr(1) of Slurm 22.05 for which entity takes which limit: ``MaxTRESPerUser``
  and ``PreemptExemptTime`` are QoS options, ``GrpTRES`` and ``MaxJobs`` association options.
- [USERS] aws-samples/awsome-distributed-training base-config (add_users.sh, shared_users_sample.txt at 0edaf15):
  one user a line, ``name,uid,/fsx/name``; homes on FSx.
- [TG] the CloudFormation registry schemas of ``AWS::SageMaker::ClusterSchedulerConfig`` and
  ``AWS::SageMaker::ComputeQuota`` (cfn-lint 1.58): at most 10 priority classes, weights 0 to 100; team and
  priority-class names ``^[a-z0-9]([-a-z0-9]*[a-z0-9]){0,39}?$``; ``FairShareWeight`` 0 to 100; sharing
  ``Lend``, ``DontLend`` or ``LendAndBorrow`` with ``BorrowLimit`` (percent; 1 to 500 in the SageMaker guide).
- [TG-SHARING] the same schemas and botocore's SageMaker model (2017-07-24, service-2.json): ``ResourceSharingConfig``'s
  ``AbsoluteBorrowLimits``, at most 15 ``ComputeQuotaResourceConfig`` entries (``InstanceType`` with ``Accelerators``,
  ``VCpu`` or ``MemoryInGiB``, each 0 to 10,000,000), caps on what a team borrows "regardless of the percentage-based
  BorrowLimit"; ``SchedulerConfig``'s ``IdleResourceSharing`` (``Enabled``/``Disabled``): "unallocated resources are
  automatically calculated and made available for entities to borrow" (SageMaker API Reference, SchedulerConfig).
- [KUEUE] "Introducing Kueue" (kubernetes.io blog, 2022-10-04) and Kueue's design, which task governance runs: a job
  stays suspended, without pods, until its queue's quota admits it, whatever nodes exist.
- [TG-LABELS] aws/sagemaker-hyperpod-cli at 011ca92: a team's namespace is ``hyperpod-ns-<team>``, its queue
  ``hyperpod-ns-<team>-localqueue``; jobs carry ``kueue.x-k8s.io/queue-name`` and
  ``kueue.x-k8s.io/priority-class: <class>-priority``. Kubernetes label values are at most 63 characters, so a team
  name is at most 40 (the queue's name) and a class name at most 54.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core import catalog
from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.rules.sagemaker import EksInstanceGroup, EksNodeRole

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
MAX_PREEMPT_EXEMPT_S = 86400  # a day: past that a tier is in effect not preemptible; say so with preempts instead
MAX_BORROW_LIMITS = 15  # [TG-SHARING], AbsoluteBorrowLimits' maxItems
MAX_QUOTA_AMOUNT = 10_000_000  # [TG-SHARING], each amount's maximum
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
    """Lower tiers whose jobs this tier's jobs may preempt (Slurm `Preempt=`): they are requeued and resume from their
    checkpoint. Slurm only: task governance on EKS takes no such list. There a team's higher-priority task preempts
    its lower-priority ones by class weight (`PreemptTeamTasks: LowerPriority`), whatever this list says, and a team
    reclaims the quota it lent by preempting the borrowers' tasks."""
    max_gpus: int | None = None
    """Most GPUs one job of this tier may hold (Slurm `MaxTRES=gres/gpu=N`). Default: no limit."""
    max_wall: str | None = None
    """Longest run of one job, in Slurm's time format (`MaxWall=`), e.g. `2-00:00:00`. Default: the partition's."""
    grace_time_s: int = 300
    """When a job of this tier is preempted: seconds it gets to save a checkpoint and stop before it is requeued
    (Slurm `GraceTime=`; the job is sent its `--signal`, USR1, at once). It must cover a step and a save. 0 to
    3600."""
    preempt_exempt_s: int = 1800
    """How long a job of this tier runs before a higher tier may preempt it, in seconds, so that it reaches its first
    checkpoint (Slurm's QoS `PreemptExemptTime=`; AWS's guide sets 30 minutes). 0 to 86400. Default: 1800."""
    max_gpus_per_user: int | None = None
    """Most GPUs one user's running jobs of this tier hold together (Slurm `MaxTRESPerUser=gres/gpu=N`). Default: no
    limit."""


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class TeamMember:
    """A user who logs in and submits jobs."""

    name: str
    """POSIX login name."""
    uid: int
    """The same user id on every node, 2000 to 59999; the home is `/fsx/<name>`."""


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class BorrowLimit:
    """The most a team may borrow of one instance type's idle compute (EKS), in any of three units."""

    instance_type: str
    """A type of a compute group (its `instance_type` or a fallback type), by its `ml.` or EC2 name."""
    accelerators: int | None = None
    """Accelerators (GPUs or Trainium chips) of this type. Default: no cap in this unit."""
    vcpus: float | None = None
    """vCPUs of this type. Default: no cap in this unit."""
    memory_gib: float | None = None
    """Memory of this type, in GiB. Default: no cap in this unit."""

    def amounts(self) -> dict[str, float]:
        """The caps set, by their ``ComputeQuotaResourceConfig`` names."""
        named = {"Accelerators": self.accelerators, "VCpu": self.vcpus, "MemoryInGiB": self.memory_gib}
        return {k: v for k, v in named.items() if v is not None}


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class Team:
    """A team: a Slurm account and a task-governance team of the same name."""

    name: str
    """Lowercase letters, digits and inner hyphens, at most 40 characters."""
    share_percent: int
    """The team's share of the compute, 1 to 100. On Slurm `FairShare=`. On EKS its fair-share weight and its quota:
    this share of each compute group's accelerators (of its nodes, for a type without accelerators), rounded down, on
    every type the group may run. The teams' shares add up to at most 100."""
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
    borrow_limits: tuple[BorrowLimit, ...] = ()
    """Absolute caps on what the team borrows, per instance type (EKS, task governance's `AbsoluteBorrowLimits`, which
    apply whatever `borrow_percent` allows). Needs `borrow_percent` above 0; at most 15, one per type. Default: none,
    `borrow_percent` alone."""
    max_gpus: int | None = None
    """Slurm: most GPUs the team's running jobs hold together, its GPU cap (`GrpTRES=gres/gpu=N` on its account); a job
    that would pass it waits. Default: no cap."""
    max_gpus_per_user: int | None = None
    """Slurm: most GPUs one member's running jobs hold together (`GrpTRES=gres/gpu=N` on each member's association:
    Slurm 22.05 has `MaxTRESPerUser` only on a QoS). At most `max_gpus`. Default: no cap."""
    max_jobs_per_user: int | None = None
    """Slurm: most jobs one member of the team runs at once (`MaxJobs=N` on its account); more wait. Default: no
    limit."""
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
        """Task governance's sharing strategy (its absolute borrow limits need a team that borrows)."""
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
    idle_resource_sharing: bool = False
    """EKS: let teams that borrow also borrow the compute no team's quota covers (task governance's
    `IdleResourceSharing`, "unallocated resources are automatically calculated and made available for entities to
    borrow"). Default: false: left out, so the service's own default applies."""
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
    if not 0 <= tier.preempt_exempt_s <= MAX_PREEMPT_EXEMPT_S:
        yield problem("out of range", got=tier.preempt_exempt_s, allowed=f"0 to {MAX_PREEMPT_EXEMPT_S} seconds").at(
            f"{key}.preempt_exempt_s"
        )
    for name, value in (("max_gpus", tier.max_gpus), ("max_gpus_per_user", tier.max_gpus_per_user)):
        if value is not None and value < 1:
            yield problem("must be positive", got=value, allowed="1 or more, or null").at(f"{key}.{name}")
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
    yield from _borrow_limit_problems(team, key)
    yield from _slurm_cap_problems(team, key)


def _slurm_cap_problems(team: Team, key: str) -> Problems:
    for name in ("max_gpus", "max_gpus_per_user", "max_jobs_per_user"):
        value = getattr(team, name)
        if value is not None and value < 1:
            yield problem("must be positive", got=value, allowed="1 or more, or null").at(f"{key}.{name}")
    if team.max_gpus is not None and team.max_gpus_per_user is not None and team.max_gpus_per_user > team.max_gpus > 0:
        yield problem(
            f"above the team's own cap max_gpus {team.max_gpus}",
            got=team.max_gpus_per_user,
            allowed=f"1 to {team.max_gpus}",
        ).at(f"{key}.max_gpus_per_user")


def _borrow_limit_problems(team: Team, key: str) -> Problems:
    # [TG-SHARING]: at most 15 entries, amounts 0 to 10,000,000, caps on what a borrowing team borrows.
    if not team.borrow_limits:
        return
    if not team.borrow_percent:
        yield problem(
            "caps on borrowing for a team that does not borrow",
            got="borrow_percent: 0",
            allowed="borrow_percent 1 to 500",
        ).at(f"{key}.borrow_limits")
    if len(team.borrow_limits) > MAX_BORROW_LIMITS:
        yield problem("too many", got=len(team.borrow_limits), allowed=f"at most {MAX_BORROW_LIMITS}").at(
            f"{key}.borrow_limits"
        )
    types: set[str] = set()
    for j, limit in enumerate(team.borrow_limits):
        lkey = f"{key}.borrow_limits[{j}]"
        spec = catalog.lookup(limit.instance_type)
        if spec is None:
            yield catalog.unknown_instance_type(limit.instance_type).at(f"{lkey}.instance_type")
        elif spec.sagemaker_name in types:
            yield problem("named twice", got=limit.instance_type, allowed="one limit per type").at(
                f"{lkey}.instance_type"
            )
        else:
            types.add(spec.sagemaker_name)
        if not limit.amounts():
            yield problem("no amount", got=limit.instance_type, allowed="accelerators, vcpus or memory_gib").at(lkey)
        for name, value in (
            ("accelerators", limit.accelerators),
            ("vcpus", limit.vcpus),
            ("memory_gib", limit.memory_gib),
        ):
            if value is not None and not 0 <= value <= MAX_QUOTA_AMOUNT:
                yield problem("out of range", got=value, allowed=f"0 to {MAX_QUOTA_AMOUNT:,}").at(f"{lkey}.{name}")


def eks_team_problems(
    teams: TeamsConfig,
    groups: Sequence[EksInstanceGroup],
    *,
    teams_key: str = "teams",
    groups_key: str = "instance_groups",
) -> Problems:
    """What task governance cannot give these teams on these groups: a borrow limit on a type no compute group runs,
    and quotas on an autoscaled group."""
    compute = [g for g in groups if g.role is EksNodeRole.COMPUTE]
    runs = {t for g in compute for t in g.instance_types}
    for i, team in enumerate(teams.teams):
        for j, limit in enumerate(team.borrow_limits):
            spec = catalog.lookup(limit.instance_type)
            if spec is not None and spec.sagemaker_name not in runs:
                yield problem(
                    "no compute group runs this type",
                    got=limit.instance_type,
                    allowed=", ".join(sorted(runs)) or "none",
                ).at(f"{teams_key}.teams[{i}].borrow_limits[{j}].instance_type")
    # A quota on an autoscaled group is either Karpenter's maximum, with 0 nodes deployed, which CreateComputeQuota may
    # refuse (no AWS source says whether it checks the cluster's current capacity), or the 0 deployed, with which
    # Kueue admits no job, so no pod ever waits and Karpenter never adds a node [KUEUE]. Neither is known to deploy and
    # work, so the combination is refused (docs/teams.md, "Teams and autoscaled groups").
    if teams.teams:
        for i, g in enumerate(groups):
            if g.role is EksNodeRole.COMPUTE and g.autoscaled:
                yield problem(
                    "a team quota on an autoscaled group is untested either way: Karpenter's maximum may be refused "
                    "against 0 nodes, and 0 admits no job (docs/teams.md)",
                    got=True,
                    allowed="autoscale: false with teams",
                ).at(f"{groups_key}[{i}].autoscale")


__all__ = [
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "BorrowLimit",
    "QosTier",
    "Team",
    "TeamMember",
    "TeamsConfig",
    "eks_team_problems",
    "job_team",
    "priority_class",
    "queue_name",
    "team_namespace",
]
