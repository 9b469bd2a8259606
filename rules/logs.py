"""CloudWatch Logs: the retentions a log group accepts."""

from __future__ import annotations

from moe_cdk.core.problems import Problem, problem

# CloudWatch Logs API reference, PutRetentionPolicy: retentionInDays.
RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


def retention_problem(days: int) -> Problem | None:
    if days in RETENTION_DAYS:
        return None
    return problem("not a CloudWatch Logs retention", got=days, allowed=", ".join(map(str, RETENTION_DAYS)) + " days")
