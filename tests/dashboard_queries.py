"""The panels and queries of the generated dashboards, with Grafana's variables filled in, and
which of them a set of real systems leaves without data."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alerts.config import RulesConfig
from alerts.recording import recording_rules
from tests.conftest import wait_for

DASHBOARDS_DIR = Path(__file__).resolve().parent.parent / "dashboards"
# What Grafana substitutes: every variable at "All", the rate interval a short window that
# holds several samples at the tests' 1s scrape interval.
VARIABLE_VALUES = {"__rate_interval": "10s", "__interval": "1s", "__range": "10s"}
ALL = ".*"


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panels(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in document["panels"]:
        if panel["type"] != "row":
            yield panel
        yield from panel.get("panels", [])


def fill(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VARIABLE_VALUES.get(m.group(1), ALL), expr)


def panel_queries() -> list[PanelQuery]:
    return [
        PanelQuery(name, panel["title"], fill(target["expr"]))
        for name, document in dashboards().items()
        for panel in panels(document)
        for target in panel["targets"]
    ]


# Part of a query or recorded series -> the systems that cannot feed it, and why.
NotFed = Mapping[str, tuple[frozenset[str], str]]


def not_fed_by_redis_alone(systems: frozenset[str]) -> NotFed:
    """What no system read from its own Redis records feeds: depth limits, leases and
    Attune's tables (the other layouts' and Attune's, tested with them)."""
    return {
        "max_depth": (systems, "no depth limit"),
        "capacity_used": (systems, "no depth limit"),
        "leases_expired": (systems, "no leases"),
        "concurrency": (systems, "no concurrency limit in Redis (Attune's)"),
        "stats_age": (systems, "Attune's statistics table"),
        "queue_executions": (systems, "Attune's executions"),
    }


def expected_systems(expr: str, systems: tuple[str, ...], not_fed: NotFed) -> set[str]:
    """The systems that must appear in the query's result."""
    expected = set(systems)
    for part, (unfed, _reason) in not_fed.items():
        if part in expr:
            expected -= unfed
    return expected


def short_of_data(
    query: Callable[[str], list[dict[str, Any]]],
    rules: RulesConfig,
    systems: tuple[str, ...],
    not_fed: NotFed,
) -> list[str]:
    """Every panel query (but the exporter's own dashboard) and recording rule whose result,
    by system, lacks one of `systems` that can feed it."""
    named = [
        (f"{q.dashboard}: {q.panel}", q.expr)
        for q in panel_queries()
        if q.dashboard != "queue-exporter-self.json"  # the exporter's own, not a system's
    ]
    named += [
        (f"recording rule {rule.record}", rule.record)
        for rule in recording_rules(rules)
        if "queue_exporter" not in rule.record
    ]
    short = []
    for where, expr in named:
        found = {item["metric"].get("system") for item in query(expr)}
        if None in found:
            continue  # aggregated over systems: not attributable
        expected = expected_systems(expr, systems, not_fed)
        if not expected <= found:
            short.append(f"{where} has {sorted(found)}, not {sorted(expected)}: {expr}")
    return short


def wait_until_fed(
    query: Callable[[str], list[dict[str, Any]]],
    rules: RulesConfig,
    systems: tuple[str, ...],
    not_fed: NotFed,
    timeout: float = 90.0,
) -> None:
    """Wait until no query is short_of_data; at the deadline, fail naming every one still short
    (the last look, not just "condition not met")."""
    short: list[str] = []

    def fed() -> bool:
        short[:] = short_of_data(query, rules, systems, not_fed)
        return not short

    try:
        wait_for(fed, timeout=timeout, interval=2.0)
    except AssertionError:
        without = " or ".join(systems)
        raise AssertionError(f"without {without} data:\n" + "\n".join(short)) from None
