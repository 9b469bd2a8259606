"""HyperPodInference as a CDK user reuses it: every problem with its props named, before anything is built."""

from __future__ import annotations

import pytest
from aws_cdk import aws_eks_v2 as eks
from conftest import stack_for_test

from moe_cdk.constructs.hyperpod_inference import HyperPodInference, HyperPodInferenceProps


def test_props_the_operator_cannot_use_are_each_refused_by_name():
    stack = stack_for_test()
    props = HyperPodInferenceProps(
        eks_cluster=eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="c"),
        hyperpod_cluster_arn="arn:aws:sagemaker:us-east-2:123456789012:cluster/abc",
        execution_role_name="InferenceRole",
        tls_bucket_name="certificates",
        model_bucket_name="models",
        model_prefixes=[],
    )
    with pytest.raises(ValueError) as error:
        HyperPodInference(stack, "Inference", props)
    text = str(error.value)
    for prop in (
        "execution_role_name: the operator's chart",
        "tls_bucket_name: the operator may write",
        "model_prefixes",
    ):
        assert prop in text, text
