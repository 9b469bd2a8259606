"""The package layout: `import constructs` stays the library, and the wheel works in someone else's app."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import textwrap
import tomllib
import venv

from conftest import PYTHON, ROOT, WITHOUT_CLOUDFORMATION_VALIDATION

ENV = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}


def test_import_constructs_from_the_repository_root_gives_the_library():
    result = subprocess.run(
        [PYTHON, "-c", "import constructs; print(constructs.__file__); print(constructs.Construct.__module__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    path, module = result.stdout.split()
    assert "site-packages" in path and module.startswith("constructs")


def test_no_init_module_at_the_root_of_constructs():
    assert not (ROOT / "constructs/__init__.py").exists()


def test_an_unrelated_app_synthesizes_the_installed_constructs(tmp_path):
    """`pip install .` into a fresh virtualenv, then a CDK app outside the repository uses the constructs.

    The wheel is installed without dependencies; the fresh environment borrows this one's
    (aws-cdk-lib and friends) through a .pth file, which does not bring the editable install along.
    """
    wheels = tmp_path / "wheels"
    subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        env=ENV,
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    fresh_python = env_dir / "bin/python"
    site = subprocess.run(
        [str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (tmp_path / "venv" / site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(fresh_python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheels.glob("*.whl"))],
        check=True,
        capture_output=True,
        env=ENV,
    )

    app_dir = tmp_path / "their-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(
        textwrap.dedent("""\
        import aws_cdk as cdk
        from aws_cdk import aws_ec2 as ec2
        import moe_cdk.constructs.lustre_storage as lustre_module
        from moe_cdk.constructs.lustre_storage import LustreStorage, LustreStorageProps
        from moe_cdk.constructs.training_network import TrainingNetwork, TrainingNetworkProps
        from moe_cdk.constructs.training_observability import TrainingObservability, TrainingObservabilityProps

        app = cdk.App(outdir="out")
        stack = cdk.Stack(app, "TheirStack", env=cdk.Environment(region="us-west-2"))
        network = TrainingNetwork(stack, "Net", TrainingNetworkProps(availability_zones=["us-west-2c"]))
        nodes = ec2.SecurityGroup(stack, "Nodes", vpc=network.vpc)
        LustreStorage(stack, "Fsx", LustreStorageProps(
            vpc=network.vpc, availability_zone="us-west-2c", client_security_group=nodes))
        # The dashboards' Lambda code is package data of the wheel.
        TrainingObservability(stack, "Obs", TrainingObservabilityProps(
            name="their", dashboards={"d.json": '{"uid": "d", "title": "D", '
            '"templating": {"list": [{"type": "datasource", "name": "datasource"}]}}'}))
        app.synth()
        print(lustre_module.__file__)
    """)
    )
    # The CDK CLI synths of the shipped configurations, which hold these constructs, run the validation.
    env = {**ENV, **WITHOUT_CLOUDFORMATION_VALIDATION}
    result = subprocess.run([str(fresh_python), "app.py"], cwd=app_dir, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert str(env_dir) in result.stdout, "the app must use the installed wheel, not the repository"
    template = (app_dir / "out/TheirStack.template.json").read_text()
    assert '"AWS::FSx::FileSystem"' in template and '"us-west-2c"' in template
    assert '"Custom::GrafanaDashboards"' in template


def test_every_importable_folder_of_the_package_is_in_the_packages_list():
    # Otherwise setuptools warns at every install ("Package would be ignored", about 40 lines).
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    importable = {
        ".".join([package, *folder.relative_to(ROOT / source).parts])
        for package, source in setuptools["package-dir"].items()
        for folder in (ROOT / source).rglob("*")
        if folder.is_dir() and folder.name != "__pycache__" and folder.name.isidentifier() and any(folder.glob("*.py"))
    }
    assert importable - listed == set()
