"""AWS's deploy-time rules, one module per service, written as checks that run at synth, and the
shapes of the API requests they check (HyperPod instance groups, taints, data repository associations).

Each rule names its source (an AWS guide, API reference or botocore model) in a comment and
returns ``core.problems.Problem``s without a key or keyed within the value it was given, so the
configuration loader and the constructs word a problem alike and each places it under its own key.
Nothing here imports CDK: ``moe-cdk validate`` and the constructs use the same functions.
"""
