"""Reading Grafana dashboard JSON in tests: every panel, and every PromQL expression (a library, not a test file)."""

from __future__ import annotations

from collections.abc import Iterator


def panels(items: list[dict]) -> Iterator[dict]:
    """Every panel, with those a collapsed row holds."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression: panel targets and the template variables' queries."""
    exprs = [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", [])]
    return exprs + [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
