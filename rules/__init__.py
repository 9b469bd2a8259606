"""AWS's deploy-time rules, one module per service, written as checks that run at synth.

Each rule names its source (an AWS guide, API reference or botocore model) in a comment and
returns the ``<what is wrong> (got X; allowed Y)`` part of a problem line, so the configuration
loader and the constructs word it alike and each adds its own key. Nothing here imports CDK:
``moe-cdk validate`` and the constructs use the same functions.
"""
