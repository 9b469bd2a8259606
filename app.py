#!/usr/bin/env python3
"""CDK entry point: ``cdk synth -c config=config/x.yaml`` or ``python app.py``.

Run by the CDK CLI, the App gets cdk.json's context and the output folder from the CLI.
Run directly, it reads cdk.json's context itself and writes to cdk.out, so both ways
produce the same templates.
"""

import sys

from moe_cdk.cli.synth import main

if __name__ == "__main__":
    sys.exit(main())
