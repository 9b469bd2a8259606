"""The Lustre file system as a Kubernetes volume: a static PersistentVolume and its claim.

The FSx CSI driver (``fsx.csi.aws.com``) mounts the file system by its ID, DNS name and
mount name, all taken from the ``LustreStorage`` construct's attributes: no ID is copied by
hand. The claim binds to exactly this volume (``volumeName`` and an empty storage class), so
a default storage class can never provision a different one. ReadWriteMany: every training
pod mounts it.

A team's claim (``team``) is confined to the team's own folder, ``teams/<team>``, and its namespace refuses the pods
that could reach past it:

* The volume mounts only that folder. The driver mounts ``<dnsname>@tcp:/<mountname>`` as it is given
  (kubernetes-sigs/aws-fsx-csi-driver@5b22712:pkg/driver/node.go, NodePublishVolume), so a ``mountname`` of
  ``<mount name>/teams/<team>`` is a Lustre subdirectory mount: the node's kernel mounts that folder as the volume's
  root, and nothing above it is reachable through it (no ``..`` past a mount root, no ``.lustre`` directory in a
  subdirectory mount: Lustre's design, LU-28). The driver has no subdirectory attribute of its own (the
  proposals, aws-fsx-csi-driver#247 and #272, were not merged), and it does not create the folder: an
  administrator does, once (docs/teams.md), or the team's pods wait with a mount error. A ``subPath`` in the pod
  would confine nothing, since the pod could mount the claim's root instead.
* The team cannot claim another volume: PersistentVolumes are cluster-wide, each one here is bound to one claim
  (``claimRef``), and HyperPod's team role grants pods, jobs and ConfigMaps in the namespace, no
  PersistentVolumes or claims (aws/sagemaker-hyperpod-cli@011ca92:helm_chart/HyperPodHelmChart/charts/
  team-role-and-bindings/templates/team-level-namespaced-role.yaml). The driver registers no inline (ephemeral)
  volumes (its CSIDriver object, charts/aws-fsx-csi-driver/templates/csidriver.yaml), so a pod cannot name the
  file system directly either.
* The namespace enforces Pod Security "baseline" (Kubernetes docs, "Pod Security Standards" and "Pod Security
  Admission"): no privileged container, no added capability beyond the baseline list (no SYS_ADMIN to mount the
  whole file system), no hostPath (the node's mounts of other teams' volumes), no host network, PID or IPC.

The claim of ``namespace`` without a team is the whole file system, for the administrators.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from moe_cdk.constructs.validation import Problem, problem, raise_if_any
from moe_cdk.rules.eks import KUBERNETES_NAME
from moe_cdk.rules.teams import TEAM_NAME, team_namespace

CSI_DRIVER = "fsx.csi.aws.com"
TEAMS_FOLDER = "teams"
"""The folder of the file system that holds one folder per team, ``teams/<team>``."""
# Pod Security Admission's namespace labels: the level enforced, against the policies of the cluster's own version.
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


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
    team: str | None = None
    """The team whose namespace (``hyperpod-ns-<team>``, which ``namespace`` must be) holds the claim: the volume is
    then the team's folder ``teams/<team>`` only, and the namespace enforces Pod Security baseline. Default: none,
    the whole file system."""


def team_folder(team: str) -> str:
    """The folder of ``team`` in the file system, from its root."""
    return f"{TEAMS_FOLDER}/{team}"


def volume_manifests(props: LustreVolumeProps, volume_name: str) -> list[dict]:
    """The Namespace, PersistentVolume and PersistentVolumeClaim, as Kubernetes objects."""
    capacity = f"{props.storage_capacity_gib}Gi"
    namespace = {"name": props.namespace, **({"labels": dict(POD_SECURITY_LABELS)} if props.team else {})}
    # mount_name may be a token (LustreStorage.mount_name); CDK joins the folder to it in the template.
    mount_name = f"{props.mount_name}/{team_folder(props.team)}" if props.team else props.mount_name
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": namespace},
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
                    "volumeAttributes": {"dnsname": props.dns_name, "mountname": mount_name},
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
        # A team's namespace is task governance's, created with the team's quota before this claim (AWS's order,
        # stacks/hyperpod_eks_stack.py), so its manifest is applied (kubectl apply, which adds the Pod Security labels
        # to it), not created (kubectl create, which fails on an existing namespace).
        self.manifest = eks.KubernetesManifest(
            self, "Manifest", cluster=props.cluster, manifest=self.manifests, overwrite=props.team is not None
        )

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
        if props.team is not None:
            if not TEAM_NAME.match(props.team):
                found.append(
                    problem(
                        "not a team name", got=props.team, allowed="lowercase letters, digits and inner hyphens"
                    ).at("team")
                )
            elif props.namespace != team_namespace(props.team):
                found.append(
                    problem(
                        f"team {props.team}'s claim must be in its task-governance namespace",
                        got=props.namespace,
                        allowed=team_namespace(props.team),
                    ).at("namespace")
                )
        if props.storage_capacity_gib < 1:
            found.append(
                problem(
                    "must be positive", got=props.storage_capacity_gib, allowed="the file system's capacity in GiB"
                ).at("storage_capacity_gib")
            )
        return found
