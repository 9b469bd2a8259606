"""Check an AWS ParallelCluster 3.x cluster configuration offline, with ParallelCluster's own schema and validators.

Why offline: there is no AWS account here, yet the ``ClusterConfiguration`` that moe-cdk synthesizes for its
``Custom::PclusterCluster`` should meet what ``pcluster create-cluster`` checks before the stack deploys.

What it runs, as ``Cluster._validate_and_parse_config`` (pcluster/models/cluster.py) does:

1. ``ClusterSchema(cluster_name=...).load(config)`` (pcluster/schemas/cluster_schema.py). A schema error prints one
   ``path: message`` line per marshmallow error and exits 2.
2. ``config.validate(...)``: every validator, one line per failure, ``LEVEL ValidatorType: message``; exit 1 when
   one is an ERROR, else 0.

Every AWS call goes through boto3's default session; a botocore ``before-call`` hook answers it here. The answers
come from ``--facts FILE`` (what our own stacks create: subnets, file systems, capacity reservations) and, for what
the file does not name, from the configuration itself (one VPC, every subnet in ``<region>a``, head/login subnets
public; a reservation of the referencing compute resource's type and MaxCount). Instance types come from a table of
the types moe-cdk's catalog knows (core/catalog.py). Answers that only a real account can give (IAM, S3, key pairs,
security group rules, RunInstances dry runs) are "yes", and listed at the end as not verified. A call with no answer
is refused, and reported as unhandled.

Run by ``moe-cdk parallelcluster-check`` (which ``make synth`` runs for a ParallelCluster configuration) with
ParallelCluster's own interpreter, which ``make parallelcluster`` sets up (standard library, ParallelCluster and its
few dependencies; no moe_cdk, no aws_cdk):
``.venv-pcluster/bin/python cli/parallelcluster_validate.py CONFIG.yaml [--facts F.json] [--cluster-name N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import copy
import datetime
import hashlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import yaml

EXIT_OK, EXIT_ERRORS, EXIT_SCHEMA = 0, 1, 2
ACCOUNT = "123456789012"
VPC_CIDR = "10.0.0.0/16"

# Not verifiable offline: the hook answers "yes"; the report lists each one that was asked.
ASSUMED = {
    "ec2.RunInstances": "RunInstances dry run (quotas, AMI and instance compatibility, iam:PassRole)",
    "ec2.DescribeKeyPairs": "EC2 key pair exists",
    "ec2.DescribeSecurityGroups": "security group rules (every group allows the VPC CIDR)",
    "ec2.DescribePlacementGroups": "placement group exists",
    "iam.GetPolicy": "IAM policy exists",
    "iam.GetRole": "IAM role exists",
    "iam.GetInstanceProfile": "IAM instance profile exists",
    "s3.HeadBucket": "S3 bucket exists and is readable",
    "s3.HeadObject": "S3 object exists (custom action scripts)",
    "s3.GetBucketLocation": "S3 bucket is in the cluster's region",
    "secretsmanager.DescribeSecret": "Secrets Manager secret exists (the accounting database's password)",
}

# Instance types: the figures of core/catalog.py (_SPECS), as DescribeInstanceTypes items. Copied, not imported: this
# runs without moe_cdk. name: (vCPUs, memory GiB, EFA interfaces, GPU model, GPU count, GB per GPU).
CATALOG: dict[str, tuple[int, int, int, str, int, float]] = {
    "p5en.48xlarge": (192, 2048, 16, "H200", 8, 141),
    "p5.48xlarge": (192, 2048, 32, "H100", 8, 80),
    "p4de.24xlarge": (96, 1152, 4, "A100", 8, 80),
    "trn2.48xlarge": (192, 2048, 16, "", 0, 0),  # Trainium2: no GpuInfo
    "m5.xlarge": (4, 16, 0, "", 0, 0),
    "m5.2xlarge": (8, 32, 0, "", 0, 0),
    "m5.4xlarge": (16, 64, 0, "", 0, 0),
    "m5.8xlarge": (32, 128, 0, "", 0, 0),
    "m5.12xlarge": (48, 192, 0, "", 0, 0),
    "m5.16xlarge": (64, 256, 0, "", 0, 0),
    "m5.24xlarge": (96, 384, 0, "", 0, 0),
}


def instance_type_data(name: str) -> dict[str, Any]:
    """The DescribeInstanceTypes fields that pcluster/aws/aws_resources.py ``InstanceTypeInfo`` reads."""
    vcpus, memory_gib, efa, gpu_model, gpus, gpu_gb = CATALOG[name]
    accelerated = efa > 0  # the accelerated types are sold as Capacity Blocks, not as Spot, and have NVMe disks
    cards = max(efa, 1)  # one network card per EFA interface on these types
    network = {"MaximumNetworkCards": cards, "EfaSupported": accelerated,
               # only the templates read the per-card figure (pcluster/templates/queues_stack.py), no validator
               "NetworkCards": [{"NetworkCardIndex": i, "MaximumNetworkInterfaces": 2} for i in range(cards)],
               **({"EfaInfo": {"MaximumEfaInterfaces": efa}} if accelerated else {})}  # fmt: skip
    data: dict[str, Any] = {
        "InstanceType": name, "CurrentGeneration": True, "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "SupportedUsageClasses": ["on-demand", "capacity-block"] if accelerated else ["on-demand", "spot"],
        "VCpuInfo": {"DefaultVCpus": vcpus, "DefaultCores": vcpus // 2, "DefaultThreadsPerCore": 2},
        "MemoryInfo": {"SizeInMiB": memory_gib * 1024}, "InstanceStorageSupported": accelerated,
        "EbsInfo": {"EbsOptimizedSupport": "default", "EncryptionSupport": "supported", "NvmeSupport": "required"},
        "NetworkInfo": network, "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
    }  # fmt: skip
    if gpus:
        mib = round(gpu_gb * 1e9 / 2**20)  # the catalog states GB (10**9 bytes), EC2 states MiB
        gpu = {"Name": gpu_model, "Manufacturer": "NVIDIA", "Count": gpus, "MemoryInfo": {"SizeInMiB": mib}}
        data["GpuInfo"] = {"Gpus": [gpu], "TotalGpuMemoryInMiB": gpus * mib}
    return data


# Facts: what the resources the configuration names look like


def fake_id(prefix: str, *seed: object) -> str:
    """A deterministic AWS-looking id, e.g. ``vpc-`` and 17 hex digits."""
    return f"{prefix}-{hashlib.sha1('/'.join(map(str, seed)).encode()).hexdigest()[:17]}"


@dataclass
class Facts:
    region: str
    subnets: dict[str, dict] = field(default_factory=dict)  # id -> availability_zone, public, cidr
    file_systems: dict[str, dict] = field(default_factory=dict)  # id -> deployment_type, availability_zone
    capacity_reservations: dict[str, dict] = field(default_factory=dict)  # id -> instance_type, count, az, type
    vpc_id: str = fake_id("vpc", "cluster-vpc")

    def subnet_in(self, az: str) -> str:
        """A subnet of ``az``: a known one, else a new private one."""
        for subnet, info in self.subnets.items():
            if info["availability_zone"] == az:
                return subnet
        subnet = fake_id("subnet", az)
        self.subnets[subnet] = {"availability_zone": az, "public": False, "cidr": f"10.0.{len(self.subnets)}.0/24"}
        return subnet


def queues(cfg: dict) -> list[dict]:
    sched = cfg.get("Scheduling") or {}
    return (sched.get("SlurmQueues") or []) + (sched.get("AwsBatchQueues") or [])


def referenced_subnets(cfg: dict) -> Iterator[tuple[str, bool]]:
    """(subnet id, public by default): head node and login subnets face users, queue subnets do not."""
    yield (cfg.get("HeadNode") or {}).get("Networking", {}).get("SubnetId"), True
    for pool in (cfg.get("LoginNodes") or {}).get("Pools") or []:
        yield from ((s, True) for s in (pool.get("Networking") or {}).get("SubnetIds") or [])
    for queue in queues(cfg):
        yield from ((s, False) for s in (queue.get("Networking") or {}).get("SubnetIds") or [])


def referenced_reservations(cfg: dict, region: str) -> Iterator[tuple[str, dict]]:
    """Each reservation a compute resource names, as if bought for it: its instance type, MaxCount, queue's zone."""
    for queue in queues(cfg):
        queue_cr = (queue.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
        kind = "capacity-block" if queue.get("CapacityType") == "CAPACITY_BLOCK" else "default"
        for resource in queue.get("ComputeResources") or []:
            cr_id = (resource.get("CapacityReservationTarget") or {}).get("CapacityReservationId") or queue_cr
            if cr_id and resource.get("InstanceType"):
                count = int(resource.get("MaxCount", resource.get("MinCount", 1)) or 1)
                info = {"instance_type": resource["InstanceType"], "count": count, "type": kind}
                yield cr_id, {"availability_zone": f"{region}a", **info}


def build_facts(cfg: dict, given: dict) -> Facts:
    """``given`` (the --facts file) first; whatever it does not name is derived from the configuration."""
    facts = Facts(region=cfg.get("Region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    given_subnets = given.get("subnets", {})
    for subnet, public in referenced_subnets(cfg):
        if subnet and subnet not in facts.subnets:
            info = {"availability_zone": f"{facts.region}a", "public": public, **given_subnets.get(subnet, {})}
            facts.subnets[subnet] = {**info, "cidr": f"10.0.{len(facts.subnets)}.0/24"}
    facts.capacity_reservations = dict(referenced_reservations(cfg, facts.region))
    for cr_id, info in given.get("capacity_reservations", {}).items():
        facts.capacity_reservations[cr_id] = {**facts.capacity_reservations.get(cr_id, {}), **info}
    facts.file_systems = dict(given.get("file_systems", {}))
    return facts


# The offline AWS: a botocore before-call hook. Handlers are ``<service>__<snake_case_operation>(params)``.

# The validator that is running, to attribute each call; calls outside one happen while the model is built.
CURRENT = contextvars.ContextVar("current_validator", default="(config load)")


class AwsError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class OfflineAws:
    def __init__(self, facts: Facts):
        self.facts = facts
        self.calls: list[tuple[str, str, str]] = []  # (validator, "service.Operation", outcome)
        self.now = datetime.datetime.now(datetime.timezone.utc)

    def install(self) -> None:
        """Hook boto3's default session, from which pcluster/aws/common.py creates every client."""
        import boto3

        boto3.setup_default_session(region_name=self.facts.region)
        boto3.DEFAULT_SESSION.events.register("before-parameter-build", self._keep_params)
        boto3.DEFAULT_SESSION.events.register("before-call", self._answer)

    @staticmethod
    def _keep_params(params: dict, context: dict, **_: Any) -> None:
        context["offline_params"] = copy.deepcopy(params)  # before-call sees only the serialized request

    def _answer(self, model: Any, context: dict, **_: Any) -> tuple[SimpleNamespace, dict]:
        from botocore import xform_name

        service = model.service_model.service_name
        op = f"{service}.{model.name}"
        handler = getattr(self, f"{service}__{xform_name(model.name)}", None)
        try:
            if handler is None:
                raise AwsError("OfflineUnhandled", f"no offline answer for {op}")
            body, status, outcome = handler(context.get("offline_params", {})), 200, "answered"
        except AwsError as e:
            body, status = {"Error": {"Code": e.code, "Message": e.message}}, e.status
            outcome = {"OfflineUnhandled": "unhandled", "DryRunOperation": "answered"}.get(e.code, f"error:{e.code}")
        self.calls.append((CURRENT.get(), op, "assumed" if op in ASSUMED and outcome == "answered" else outcome))
        body.setdefault("ResponseMetadata", {"HTTPStatusCode": status, "RequestId": "offline"})
        return SimpleNamespace(status_code=status, headers={}, content=b""), body

    @staticmethod
    def _filter(params: dict, name: str) -> list[str]:
        return next((f.get("Values") or [] for f in params.get("Filters") or [] if f.get("Name") == name), [])

    # -- STS, EC2 networking --------------------------------------------------------------------------------------
    def sts__get_caller_identity(self, _: dict) -> dict:
        return {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/offline", "UserId": "AIDAOFFLINE"}

    def _subnet(self, subnet: str) -> dict:
        info = self.facts.subnets.get(subnet)
        if info is None:
            raise AwsError("InvalidSubnetID.NotFound", f"The subnet ID '{subnet}' does not exist")
        az = info["availability_zone"]
        return {"SubnetId": subnet, "VpcId": self.facts.vpc_id, "CidrBlock": info["cidr"], "AvailabilityZone": az,
                "AvailabilityZoneId": az, "MapPublicIpOnLaunch": info["public"], "State": "available",
                "AvailableIpAddressCount": 250, "OwnerId": ACCOUNT}  # fmt: skip

    def ec2__describe_subnets(self, p: dict) -> dict:
        return {"Subnets": [self._subnet(s) for s in p.get("SubnetIds") or list(self.facts.subnets)]}

    def ec2__describe_vpc_attribute(self, p: dict) -> dict:
        attribute = p["Attribute"]  # enableDnsSupport, enableDnsHostnames
        return {"VpcId": p["VpcId"], attribute[0].upper() + attribute[1:]: {"Value": True}}

    def ec2__describe_security_groups(self, p: dict) -> dict:
        def rule(cidr: str) -> dict:
            return {"IpProtocol": "-1", "IpRanges": [{"CidrIp": cidr}], "UserIdGroupPairs": [], "Ipv6Ranges": []}

        return {"SecurityGroups": [
            {"GroupId": g, "GroupName": g, "VpcId": self.facts.vpc_id, "OwnerId": ACCOUNT,
             "IpPermissions": [rule(VPC_CIDR)], "IpPermissionsEgress": [rule("0.0.0.0/0")]}
            for g in p.get("GroupIds") or []]}  # fmt: skip

    def ec2__describe_network_interfaces(self, p: dict) -> dict:
        """The ENIs of the file systems (see ``_file_system``), in the file system's subnet."""
        by_eni = {fake_id("eni", fs): fs for fs in self.facts.file_systems}
        enis = []
        for eni in p.get("NetworkInterfaceIds") or []:
            az = self.facts.file_systems.get(by_eni.get(eni), {}).get("availability_zone", f"{self.facts.region}a")
            subnet = self.facts.subnet_in(az)
            enis.append({"NetworkInterfaceId": eni, "VpcId": self.facts.vpc_id, "SubnetId": subnet, "Status": "in-use",
                         "Groups": [{"GroupId": fake_id("sg", eni), "GroupName": "file-system"}]})  # fmt: skip
        return {"NetworkInterfaces": enis}

    def ec2__describe_key_pairs(self, p: dict) -> dict:
        return {"KeyPairs": [{"KeyName": k, "KeyPairId": fake_id("key", k)} for k in p.get("KeyNames") or []]}

    def ec2__describe_placement_groups(self, p: dict) -> dict:
        names = p.get("GroupNames") or p.get("GroupIds") or []
        return {"PlacementGroups": [{"GroupName": n, "State": "available", "Strategy": "cluster"} for n in names]}

    def ec2__run_instances(self, p: dict) -> dict:
        if p.get("DryRun"):  # pcluster/aws/ec2.py run_instances: DryRunOperation means "would succeed"
            raise AwsError("DryRunOperation", "Request would have succeeded, but DryRun flag is set.", 412)
        raise AwsError("UnauthorizedOperation", "the offline check never launches instances")

    # -- EC2 instance types, capacity ------------------------------------------------------------------------------
    def ec2__describe_instance_types(self, p: dict) -> dict:
        unknown = [t for t in p.get("InstanceTypes") or [] if t not in CATALOG]
        if unknown:
            raise AwsError("InvalidInstanceType", f"The following supplied instance types do not exist: {unknown}")
        return {"InstanceTypes": [instance_type_data(t) for t in p.get("InstanceTypes") or []]}

    def ec2__describe_instance_type_offerings(self, p: dict) -> dict:
        location_type = p.get("LocationType", "region")
        locations = [self.facts.region] if location_type == "region" else self._filter(p, "location")
        types = self._filter(p, "instance-type") or sorted(CATALOG)
        offers = [{"InstanceType": t, "LocationType": location_type, "Location": at} for t in types for at in locations]
        return {"InstanceTypeOfferings": offers}

    def _reservation(self, cr_id: str) -> dict:
        info = self.facts.capacity_reservations.get(cr_id)
        if info is None:
            raise AwsError("InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{cr_id}' not found")
        start, block = self.now - datetime.timedelta(hours=1), info.get("type") == "capacity-block"
        return {
            "CapacityReservationId": cr_id, "OwnerId": ACCOUNT, "InstanceType": info["instance_type"],
            "InstancePlatform": "Linux/UNIX", "AvailabilityZone": info["availability_zone"], "Tenancy": "default",
            "TotalInstanceCount": info["count"], "AvailableInstanceCount": info["count"],
            "State": info.get("state", "active"), "StartDate": start, "CreateDate": start,
            "InstanceMatchCriteria": "targeted", "ReservationType": info.get("type", "default"),
            "EndDateType": "limited" if block else "unlimited",
            **({"EndDate": self.now + datetime.timedelta(days=7)} if block else {}),
        }  # fmt: skip

    def ec2__describe_capacity_reservations(self, p: dict) -> dict:
        ids = p.get("CapacityReservationIds") or list(self.facts.capacity_reservations)
        return {"CapacityReservations": [self._reservation(i) for i in ids]}

    # -- EC2 images: the official AMI ParallelCluster looks up by name (pcluster/aws/ec2.py get_official_image_id) --
    def ec2__describe_images(self, p: dict) -> dict:
        names = [n.replace("*", "") + "-202501010000" for n in self._filter(p, "name")]
        images = [(fake_id("ami", n), n) for n in names] + [(i, f"custom-{i}") for i in p.get("ImageIds") or []]
        return {"Images": [
            {"ImageId": i, "Name": n, "Architecture": "x86_64", "State": "available", "OwnerId": ACCOUNT,
             "CreationDate": "2025-01-01T00:00:00.000Z", "RootDeviceName": "/dev/sda1", "RootDeviceType": "ebs",
             "VirtualizationType": "hvm", "EnaSupport": True, "PlatformDetails": "Linux/UNIX",
             "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 40, "VolumeType": "gp3"}}]}
            for i, n in images]}  # fmt: skip

    # -- FSx for Lustre ----------------------------------------------------------------------------------------------
    def _file_system(self, fs_id: str) -> dict:
        info = self.facts.file_systems.get(fs_id)
        if info is None:  # not in --facts: a PERSISTENT_2 file system in the first subnet's zone
            first = next(iter(self.facts.subnets.values()), {"availability_zone": f"{self.facts.region}a"})
            info = self.facts.file_systems[fs_id] = {"availability_zone": first["availability_zone"]}
        lustre = {"DeploymentType": info.get("deployment_type", "PERSISTENT_2"), "MountName": fs_id[3:11]}
        return {
            "FileSystemId": fs_id, "FileSystemType": "LUSTRE", "Lifecycle": "AVAILABLE", "OwnerId": ACCOUNT,
            "VpcId": self.facts.vpc_id, "StorageCapacity": 4800, "StorageType": "SSD",
            "SubnetIds": [self.facts.subnet_in(info["availability_zone"])],
            "NetworkInterfaceIds": [fake_id("eni", fs_id)], "DNSName": f"{fs_id}.fsx.{self.facts.region}.amazonaws.com",
            "LustreConfiguration": lustre, "CreationTime": self.now,
        }  # fmt: skip

    def fsx__describe_file_systems(self, p: dict) -> dict:
        return {"FileSystems": [self._file_system(f) for f in p.get("FileSystemIds") or []]}

    # -- IAM, S3: assumed to exist ---------------------------------------------------------------------------------
    def iam__get_policy(self, p: dict) -> dict:
        return {"Policy": {"Arn": p["PolicyArn"], "PolicyName": p["PolicyArn"].split("/")[-1], "IsAttachable": True}}

    def iam__get_role(self, p: dict) -> dict:
        return {"Role": {"RoleName": p["RoleName"], "Arn": f"arn:aws:iam::{ACCOUNT}:role/{p['RoleName']}",
                         "Path": "/", "RoleId": "AROAOFFLINE", "CreateDate": self.now}}  # fmt: skip

    def iam__get_instance_profile(self, p: dict) -> dict:
        name = p["InstanceProfileName"]
        return {"InstanceProfile": {"InstanceProfileName": name, "Roles": [],
                                    "Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{name}"}}  # fmt: skip

    def s3__head_bucket(self, _: dict) -> dict:
        return {"BucketRegion": self.facts.region}

    def s3__head_object(self, _: dict) -> dict:
        return {"ContentLength": 1024}

    def secretsmanager__describe_secret(self, p: dict) -> dict:
        return {"ARN": p["SecretId"], "Name": p["SecretId"].rsplit(":", 1)[-1]}

    def s3__get_bucket_location(self, _: dict) -> dict:
        return {"LocationConstraint": None if self.facts.region == "us-east-1" else self.facts.region}


# Running ParallelCluster


def offline_environment(region: str) -> None:
    """Fake credentials and no instance metadata, so that nothing can reach AWS even without the hook."""
    os.environ.update({"AWS_DEFAULT_REGION": region, "AWS_REGION": region, "AWS_ACCESS_KEY_ID": "AKIAOFFLINE",
                       "AWS_SECRET_ACCESS_KEY": "offline", "AWS_EC2_METADATA_DISABLED": "true"})  # fmt: skip
    os.environ.pop("AWS_PROFILE", None)
    logging.basicConfig(level=logging.CRITICAL)  # pcluster logs each refused call itself
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited")  # an aborted validate()


def record_validators() -> list[str]:
    """Wrap pcluster/validators/common.py's Validator.execute and AsyncValidator.execute_async: the list of the
    validators that ran, and CURRENT set while each runs."""
    from pcluster.utils import AsyncUtils
    from pcluster.validators.common import AsyncValidator, Validator

    ran: list[str] = []
    execute, execute_async = Validator.execute, AsyncValidator.execute_async

    def traced(self: Validator, *args: Any, **kwargs: Any) -> Any:
        ran.append(self.type)
        token = CURRENT.set(self.type)
        try:
            return execute(self, *args, **kwargs)
        finally:
            CURRENT.reset(token)

    async def traced_async(self: AsyncValidator, *args: Any, **kwargs: Any) -> Any:
        ran.append(self.type)
        CURRENT.set(self.type)  # each coroutine runs in its own asyncio task, so its own context
        return await execute_async(self, *args, **kwargs)

    class ContextPool(ThreadPoolExecutor):  # AsyncUtils.async_from_sync runs boto3 in threads: carry CURRENT there
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)

    Validator.execute, AsyncValidator.execute_async = traced, traced_async
    AsyncUtils._thread_pool_executor = ContextPool()
    return ran


def skip_https(skipped: list[str]) -> None:
    """pcluster/validators/s3_validators.py UrlValidator opens https:// URLs; record them instead."""
    import pcluster.validators.s3_validators as s3_validators

    def urlopen(url: str, *_: Any, **__: Any) -> contextlib.nullcontext:
        skipped.append(url)
        return contextlib.nullcontext()

    s3_validators.urlopen = urlopen


def schema_lines(messages: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """marshmallow's nested error messages as ``A.B.0.C: message`` lines."""
    if isinstance(messages, dict):
        for key, value in messages.items():
            yield from schema_lines(value, (*path, str(key)))
    elif isinstance(messages, list):
        for message in messages:
            yield from schema_lines(message, path)
    else:
        yield f"{'.'.join(path) or '(config)'}: {messages}"


def report(failures: list, ran: list[str], aws: OfflineAws, https: list[str]) -> int:
    from pcluster.validators.common import FailureLevel

    for failure in sorted(failures, key=lambda f: -f.level.value):
        print(f"{failure.level.name} {failure.validator_type}: {failure.message}")
    errors = sum(f.level == FailureLevel.ERROR for f in failures)
    print(f"# {len(set(ran))} validators ran ({len(ran)} runs); {len(failures)} findings, {errors} ERROR; "
          f"{len(aws.calls)} AWS calls answered offline")  # fmt: skip
    assumed: dict[str, set[str]] = {}
    for validator, op, outcome in aws.calls:
        if outcome == "assumed":
            assumed.setdefault(op, set()).add(validator)
    for op, validators in sorted(assumed.items()):
        print(f"# NOT VERIFIED OFFLINE (assumed): {ASSUMED[op]} [{op}, by {', '.join(sorted(validators))}]")
    for url in sorted(set(https)):
        print(f"# NOT VERIFIED OFFLINE (assumed reachable): {url}")
    for validator, op in sorted({(v, op) for v, op, outcome in aws.calls if outcome == "unhandled"}):
        print(f"# UNHANDLED AWS CALL {op} from {validator} (its finding above may be spurious)")
    return EXIT_ERRORS if errors else EXIT_OK


def check(cfg: dict, facts: Facts, cluster_name: str) -> int:
    """Schema load and validators, as pcluster/models/cluster.py ``_validate_and_parse_config`` runs them."""
    offline_environment(facts.region)
    aws = OfflineAws(facts)
    aws.install()  # before pcluster creates any client
    from marshmallow import ValidationError
    from pcluster.aws.aws_api import AWSApi
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.validators.common import ValidatorContext

    ran, https = record_validators(), []
    skip_https(https)
    extra_types = (cfg.get("DevSettings") or {}).get("InstanceTypesData")  # Cluster._load_additional_instance_type_data
    if extra_types:
        AWSApi.instance().ec2.additional_instance_types_data = json.loads(extra_types)
    try:
        config = ClusterSchema(cluster_name=cluster_name).load(copy.deepcopy(cfg))  # Cluster._load_config
    except ValidationError as e:
        print("\n".join(schema_lines(e.messages)))
        return EXIT_SCHEMA
    try:
        failures = config.validate([], ValidatorContext())
    except Exception as e:  # pcluster/models/cluster.py reports it as "Invalid cluster configuration: <e>"
        print(f"ERROR (validation aborted): Invalid cluster configuration: {e}")
        return EXIT_ERRORS
    return report(failures, ran, aws, https)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the cluster configuration, YAML (or JSON), without CloudFormation intrinsics")
    parser.add_argument("--facts", help="JSON: subnets, file_systems, capacity_reservations as our stacks make them")
    parser.add_argument("--cluster-name", default="offline-check")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        cfg = yaml.safe_load(f) or {}
    given = {}
    if args.facts:
        with open(args.facts, encoding="utf-8") as f:
            given = json.load(f)
    return check(cfg, build_facts(cfg, given), args.cluster_name)


if __name__ == "__main__":
    sys.exit(main())
