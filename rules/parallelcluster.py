"""AWS ParallelCluster as the cluster manager: the version moe-cdk pins, its provider stack, and the rules its
configuration has that moe-cdk checks before ParallelCluster would. Plain data; no CDK.

Sources (aws-parallelcluster 3.16.1 on PyPI, read 2026-12-05):

- [PC-NAMES] pcluster/validators/cluster_validators.py: ``NameValidator`` (queue and compute resource names match
  ``^[a-z][a-z0-9\\-]*$``, at most 25 characters, not ``default``); ``ClusterNameValidator`` (a letter, then letters,
  digits and hyphens, at most 60 characters, 40 with Slurm accounting).
- [PC-OS] pcluster/constants.py ``SUPPORTED_OSES``.
- [PC-UPDATE] pcluster/config/cluster_config.py ``QueueUpdateStrategy``: DRAIN, COMPUTE_FLEET_STOP (the default),
  TERMINATE. Through CloudFormation the compute fleet is never stopped (ParallelCluster User Guide, "AWS
  CloudFormation custom resource"), so COMPUTE_FLEET_STOP would refuse every queue change.
- [PC-CB] pcluster/validators/cluster_validators.py ``ComputeResourceSizeValidator``: with CapacityType
  CAPACITY_BLOCK, MinCount equals MaxCount and is above 0.
- [PC-PROVIDER] ParallelCluster User Guide, "Provider stack" and aws/aws-parallelcluster
  ``cloudformation/custom_resource/cluster.yaml``: the template AWS publishes per Region and version; its output
  ``ServiceToken`` is the custom resource's.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator

from moe_cdk.core.problems import Problem, problem
from moe_cdk.rules.sagemaker import AccountingDatabase

VERSION = "3.16.1"
"""The ParallelCluster release moe-cdk deploys and validates with (Makefile PCLUSTER_VERSION, the offline
validation's venv). A cluster is updated only by the release that created it [PC-PROVIDER]."""
RESOURCE_TYPE = "Custom::PclusterCluster"
NAME = re.compile(r"^[a-z][a-z0-9-]{0,24}$")
"""A queue's or a compute resource's name [PC-NAMES]."""
NAME_ALLOWED = "a lowercase letter, then up to 24 lowercase letters, digits and hyphens, not 'default'"
POLICY_PREFIX = "parallelcluster"
"""The provider's Lambda may attach to the nodes' roles only customer-managed policies whose names start with this
[PC-PROVIDER]."""
MOUNT_DIR = "/fsx"
CAPACITY_BLOCK_COUNTS = "Max count must be set to the same value of min count when using Capacity Block reservation."
"""ParallelCluster's own message for a Capacity Block queue whose MinCount differs from its MaxCount [PC-CB], which the
configuration's refusal quotes (a test runs ParallelCluster's validator and compares)."""
SCRATCH = "/scratch"
"""Where ParallelCluster mounts a compute node's instance store volumes (its default
``SlurmQueues/ComputeSettings/LocalStorage/EphemeralVolume/MountDir``), which moe-cdk also sets explicitly."""


class OperatingSystem(enum.Enum):
    """The operating systems of ParallelCluster's official AMIs that the lifecycle scripts run on (apt, Ubuntu's
    paths) [PC-OS]."""

    UBUNTU_2204 = "ubuntu2204"
    UBUNTU_2404 = "ubuntu2404"


class QueueUpdateStrategy(enum.Enum):
    """What an update does to running compute nodes whose queue changed [PC-UPDATE]."""

    DRAIN = "DRAIN"
    """Running jobs finish; the nodes are replaced as they drain."""
    TERMINATE = "TERMINATE"
    """The nodes are replaced at once; their jobs are requeued and resume from their last checkpoint."""


class DeletionPolicy(enum.Enum):
    """What the custom resource does to the cluster when it leaves the stack (its own ``DeletionPolicy`` property,
    read by the provider's Lambda; not CloudFormation's attribute)."""

    RETAIN = "Retain"
    DELETE = "Delete"


def provider_template_url(region: str, url_suffix: str, version: str = VERSION) -> str:
    """Where AWS publishes the provider stack's template for ``version`` in ``region`` [PC-PROVIDER]."""
    return (
        f"https://{region}-aws-parallelcluster.s3.{region}.{url_suffix}/parallelcluster/{version}"
        "/templates/custom_resource/cluster.yaml"
    )


def database_problems(database: AccountingDatabase) -> Iterator[Problem]:
    """What is wrong with ``database`` as ParallelCluster's ``SlurmSettings.Database``: its own checks, and the user
    name that ParallelCluster takes beside a secret holding the password alone."""
    yield from database.problems()
    if database.user_name is None:
        yield problem(
            "ParallelCluster's SlurmSettings.Database takes the user name here, and a secret holding that user's "
            "password alone (docs/parallelcluster.md)",
            got=None,
            allowed="the database user slurmdbd connects as",
        ).at("user_name")


def name_problem(name: str) -> Problem | None:
    """A queue or compute resource name ParallelCluster refuses [PC-NAMES]."""
    if NAME.match(name) and name != "default":
        return None
    return problem("not a ParallelCluster queue name", got=name, allowed=NAME_ALLOWED)


def version_problem(version: str) -> Problem | None:
    if version == VERSION:
        return None
    return problem(
        "moe-cdk deploys and validates one ParallelCluster release, and a cluster is updated only by the release "
        "that created it: a cluster of another release needs a new cluster (docs/parallelcluster.md)",
        got=version,
        allowed=VERSION,
    )
