"""The EKS node setup on both EKS AMI layouts, checked with a real containerd.

HyperPod's EKS nodes run Amazon Linux 2 or Amazon Linux 2023, and containerd may or may not run
yet when the lifecycle moves its data root. On AL2023 the sandbox image is the AMI's
``localhost/kubernetes/pause``, which exists only in the old root and cannot be pulled (AWS's EKS
sample, commit 6ed2802f). For each combination, Debian's containerd is started on the old root
(``/var/lib/containerd`` of the sandbox), a pause image is imported into its ``k8s.io`` namespace,
on_create.sh moves the root, and containerd is started again exactly as the node would start it
(AL2023: the drop-in's ``--root``; AL2: the bootstrap template's ``root``). The pause image must
be there and complete.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from test_lifecycle_scripts import AL2_TEMPLATE, AL2023_DROP_IN, eks_sandbox, succeeded

PAUSE = "localhost/kubernetes/pause:latest"
# containerd's CRI plugin needs what a container here lacks; the image store does not need it.
CONFIG = 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n'


def pause_image(path: Path) -> Path:
    """An OCI image archive named like the AL2023 AMI's sandbox image: one layer holding /pause."""
    layout = path.parent / "pause-layout"
    blobs = layout / "blobs/sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        entry = tarfile.TarInfo("pause")
        entry.size, entry.mode = 10, 0o755
        tar.addfile(entry, io.BytesIO(b"#!/bin/sh\n"))
    layer_ref = blob(layer.getvalue())
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]}}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(json.dumps(config).encode())},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_ref}],
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **blob(json.dumps(manifest).encode()),
                "annotations": {"io.containerd.image.name": PAUSE},
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(json.dumps(index))
    with tarfile.open(path, "w") as tar:
        for item in sorted(layout.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(layout)), recursive=False)
    return path


class Containerd:
    """Debian's containerd on one data root, with its own socket and state folder."""

    def __init__(self, root: Path, work: Path):
        assert shutil.which("containerd") and shutil.which("ctr"), "containerd is needed: make system-packages"
        work.mkdir(parents=True, exist_ok=True)
        (work / "config.toml").write_text(CONFIG)
        self.socket = work / "containerd.sock"
        self.log = work / "containerd.log"
        command = ["containerd", "--config", str(work / "config.toml"), "--root", str(root)]
        command += ["--state", str(work / "state"), "--address", str(self.socket)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def ctr(self, *args: str) -> subprocess.CompletedProcess:
        command = ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def new_root(box, os_name: str) -> Path:
    """The root containerd starts on after the lifecycle, read from the file that node's AMI uses."""
    if os_name == "al2023":
        (start,) = [line for line in box.read(AL2023_DROP_IN).splitlines() if line.startswith("ExecStart=/")]
        return box.root / start.split("--root ", 1)[1].lstrip("/")
    (root,) = re.findall(r'^root = "([^"]+)"', box.read(AL2_TEMPLATE), flags=re.MULTILINE)
    return box.root / root.lstrip("/")


@pytest.mark.parametrize("running", ["running", "stopped"])
@pytest.mark.parametrize("os_name", ["al2", "al2023"])
def test_the_pause_image_is_in_containerds_new_root(tmp_path, os_name, running):
    box = eks_sandbox(tmp_path, config=None if os_name == "al2" else "version = 2\n", os=os_name)
    old = Containerd(box.root / "var/lib/containerd", tmp_path / "old")
    try:
        imported = old.ctr("images", "import", str(pause_image(tmp_path / "pause.tar")))
        assert imported.returncode == 0, imported.stderr
    finally:
        old.stop()
    result = succeeded(box.on_create(MOE_STUB_ACTIVE="containerd" if running == "running" else ""))
    if running == "running":  # stopped for the copy, then started on the new root
        assert box.calls("systemctl stop") == ["systemctl stop containerd"]
        assert box.calls("systemctl start") == ["systemctl start containerd"]
    root = new_root(box, os_name)
    assert root == box.root / "opt/dlami/nvme/containerd"
    moved = Containerd(root, tmp_path / "new")
    try:
        listed = moved.ctr("images", "check")
    finally:
        moved.stop()
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith(PAUSE)]
    assert "complete (2/2)" in line and line.rstrip().endswith("true"), listed.stdout
    assert "copied /var/lib/containerd (the AMI's images, the pause image among them)" in result.stdout
