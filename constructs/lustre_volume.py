"""The Lustre file system as a Kubernetes volume: a static PersistentVolume and its claim.

The FSx CSI driver (``fsx.csi.aws.com``) mounts the file system by its ID, DNS name and
mount name, all taken from the ``LustreStorage`` construct's attributes: no ID is copied by
hand. The claim binds to exactly this volume (``volumeName`` and an empty storage class), so
a default storage class can never provision a different one. ReadWriteMany: every training
pod mounts it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from moe_cdk.constructs.validation import Problem, problem, raise_if_any
from moe_cdk.rules.eks import KUBERNETES_NAME

CSI_DRIVER = "fsx.csi.aws.com"


@dataclass(frozen=True, kw_only=True)
class LustreVolumeProps:
    cluster: eks.ICluster
    """The EKS cluster, with the FSx CSI driver installed. Required."""
    file_system_id: str
    """``LustreStorage.file_system_id``. Required."""
    dns_name: str
    """``LustreStorage.dns_name``. Required."""
    mount_name: str
    """``LustreStorage.mount_name``. Required."""
    storage_capacity_gib: int
    """The file system's capacity, which the volume declares. Required."""
    namespace: str = "moe"
    """Namespace of the claim (created here), where the training jobs run. Default: moe."""
    claim_name: str = "fsx-lustre"
    """Name of the PersistentVolumeClaim that jobs mount. Default: fsx-lustre."""


def volume_manifests(props: LustreVolumeProps, volume_name: str) -> list[dict]:
    """The Namespace, PersistentVolume and PersistentVolumeClaim, as Kubernetes objects."""
    capacity = f"{props.storage_capacity_gib}Gi"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": props.namespace}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume_name},
            "spec": {
                "capacity": {"storage": capacity},
                "volumeMode": "Filesystem",
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                # Lustre mount options the nodes would use (noatime; flock for the checkpoint writers).
                "mountOptions": ["noatime", "flock"],
                "claimRef": {"namespace": props.namespace, "name": props.claim_name},
                "csi": {
                    "driver": CSI_DRIVER,
                    "volumeHandle": props.file_system_id,
                    "volumeAttributes": {"dnsname": props.dns_name, "mountname": props.mount_name},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": props.claim_name, "namespace": props.namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume_name,
                "resources": {"requests": {"storage": capacity}},
            },
        },
    ]


class LustreVolume(Construct):
    """A static FSx for Lustre PersistentVolume bound to one claim in the training namespace."""

    def __init__(self, scope: Construct, id: str, props: LustreVolumeProps) -> None:
        super().__init__(scope, id)
        raise_if_any("LustreVolume", self._problems(props))
        self.props = props
        self.volume_name = f"{props.namespace}-{props.claim_name}"
        self.claim_name = props.claim_name
        self.namespace = props.namespace
        self.manifests = volume_manifests(props, self.volume_name)
        self.manifest = eks.KubernetesManifest(self, "Manifest", cluster=props.cluster, manifest=self.manifests)

    @staticmethod
    def _problems(props: LustreVolumeProps) -> list[Problem]:
        found = []
        for key in ("namespace", "claim_name"):
            value = getattr(props, key)
            if not KUBERNETES_NAME.match(value):
                found.append(
                    problem(
                        "not a Kubernetes name",
                        got=value,
                        allowed="lowercase letters, digits and inner hyphens, at most 63",
                    ).at(key)
                )
        if props.storage_capacity_gib < 1:
            found.append(
                problem(
                    "must be positive", got=props.storage_capacity_gib, allowed="the file system's capacity in GiB"
                ).at("storage_capacity_gib")
            )
        return found
