"""Whether a change of a ParallelCluster cluster's configuration applies to the running cluster, in ParallelCluster's
own words: its ``ConfigPatch`` (pcluster/config/config_patch.py), which ``pcluster update-cluster`` runs before it
changes anything, and which needs no AWS.

Run by ``moe-cdk diff`` with ParallelCluster's interpreter (``make parallelcluster`` sets up .venv-pcluster; it
imports no moe_cdk)::

    .venv-pcluster/bin/python cli/parallelcluster_patch.py OLD.json NEW.json

OLD and NEW are the resource's ``ClusterConfiguration`` as the templates hold it. A CloudFormation intrinsic is
compared as its text: a changed reference is a changed value. It prints one JSON object: ``applies`` (true when
every change may be applied to the running cluster) and ``changes``, one per changed parameter: ``path``, ``old``,
``new``, ``check`` (SUCCEEDED, ACTION NEEDED or FAILED), ``reason`` and ``action``. The cluster is taken to be
running, with its compute and login nodes up: the answer for the cluster a deploy updates.
"""

from __future__ import annotations

import json
import os
import sys
import types


def _flat(value):
    """``value`` with each intrinsic (``{"Ref": ...}``, ``{"Fn::...": ...}``) as its JSON text."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)).startswith(("Fn::", "Ref")):
            return json.dumps(value, sort_keys=True)
        return {key: _flat(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_flat(item) for item in value]
    return value


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: parallelcluster_patch.py OLD.json NEW.json", file=sys.stderr)
        return 2
    old, new = (_flat(json.loads(open(path).read())) for path in argv)
    os.environ.setdefault("AWS_DEFAULT_REGION", new.get("Region", "us-east-1"))  # boto3 clients are made on import
    from pcluster.config.config_patch import ConfigPatch

    running = types.SimpleNamespace(
        name="cluster",
        stack_name="cluster",
        has_running_capacity=lambda: True,
        has_running_login_nodes=lambda pool_name=None: True,
        head_node_instance=types.SimpleNamespace(state="running"),
    )
    applies, rows = ConfigPatch(running, old, new).check()
    changes = [
        {
            "path": ".".join([*row[0], row[1]]),
            "old": row[2],
            "new": row[3],
            "check": row[4],
            "reason": row[5],
            "action": row[6],
        }
        for row in rows[1:]  # the first row is the header
    ]
    print(json.dumps({"applies": applies, "changes": changes}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
