"""The panels and queries of the generated dashboards, with Grafana's variables filled in."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
