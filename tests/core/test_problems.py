"""The one problem type: its text, how a caller places it under a key, and the one error type."""

from __future__ import annotations

import pytest

from moe_cdk.core.problems import ConfigError, Problem, problem, raise_if_any


def test_a_problem_reads_key_what_got_and_allowed():
    assert str(problem("not a port", got=70000, allowed="1 to 65535").at("port")) == (
        "port: not a port (got 70000; allowed 1 to 65535)"
    )


def test_a_problem_without_a_key_is_its_text_alone():
    assert str(problem("too small", got=1, allowed="2 or more")) == "too small (got 1; allowed 2 or more)"


def test_at_nests_keys_and_list_indices():
    found = problem("unknown value", got="x", allowed="a, b").at("[2].name").at("instance_groups").at("cluster")
    assert found.key == "cluster.instance_groups[2].name"


def test_a_problem_built_from_a_whole_line_keeps_it():
    assert str(Problem("", "config/x.yaml: 1 problem(s)")) == "config/x.yaml: 1 problem(s)"


def test_the_error_carries_every_problem_and_names_its_subject():
    error = ConfigError(
        [problem("a", got=1, allowed="2").at("x"), problem("b", got=3, allowed="4").at("y")],
        subject="LustreStorage props",
    )
    assert error.errors == ["x: a (got 1; allowed 2)", "y: b (got 3; allowed 4)"]
    assert str(error) == "invalid LustreStorage props:\n  x: a (got 1; allowed 2)\n  y: b (got 3; allowed 4)"
    assert isinstance(error, ValueError)


def test_raise_if_any_raises_only_for_problems():
    raise_if_any([])
    with pytest.raises(ConfigError, match="x: a"):
        raise_if_any([problem("a", got=1, allowed="2").at("x")])
