"""Data flows one way through exporter/: each package imports only the packages below it, as
LAYERS says, and no module imports, directly or round about, a module that imports it back. Every import counts, those under `if TYPE_CHECKING:` and inside
functions too: a circle only for the type checker is still a circle a reader must untangle.

The test prints the layers (a module sits one above the highest module it imports) so a
failure shows where the circle closes, and each module's place when it passes (`pytest -s`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "exporter"

# Which package may import which, from the top floor down (docs/architecture.md draws it).
# `exporter` itself (its __version__) may be imported from anywhere; a package's own modules
# import each other freely.
_SOURCE_KINDS = {"sources.redis_keys", "sources.postgres", "sources.readers", "sources.streams"}
_BELOW_CONFIG = {
    "core",
    "redis",
    "output",
    "lifecycle",
    "leader",
    "http",
    "sources",
} | _SOURCE_KINDS
LAYERS: dict[str, set[str]] = {
    "__main__": {"commands"},
    "demo": {"commands", "runtime", "config"} | _BELOW_CONFIG,
    "commands": {"runtime", "config"} | _BELOW_CONFIG,
    "runtime": {"config"} | _BELOW_CONFIG,
    "config": _BELOW_CONFIG,
    "http": {"core", "output", "sources.streams"},  # the status page names the consumer groups
    "sources.streams": {
        "core",
        "redis",
        "output",
        "lifecycle",
        "sources",
        "sources.readers",
        "sources.redis_keys",  # a stream's key as an ACL glob, as a key group's (groups.scan_glob)
    },
    "sources.readers": {
        "core",
        "redis",
        "output",
        "lifecycle",
        "sources",
        "sources.redis_keys",
        "sources.postgres",
    },
    "sources.redis_keys": {"core", "redis", "output", "sources"},
    "sources.postgres": {"core", "output", "sources"},
    # the protocol, the runner, outages, deadlines; a report carries a reader's lifecycle tally
    "sources": {"core", "output", "leader", "lifecycle"},
    "leader": {"core", "redis", "output"},
    # the ready hooks apps load (celery, rq, dramatiq, arq): nothing of the exporter imports them
    "hooks": {"core", "lifecycle"},
    "lifecycle": {"core", "output"},
    "output": {"core"},
    "redis": {"core"},
    "core": set(),
}

# A source returns what it saw (sources/source.py SourceReport) and the runner alone applies it
# to the store, the health board and the self-metrics: no other module under exporter/sources
# imports the Telemetry that holds them (a source holding it would write to it mid-cycle).
TELEMETRY = "exporter.output.telemetry"
TELEMETRY_AMONG_THE_SOURCES = {"exporter.sources.runner"}


def package_of(module: str) -> str:
    """A module's package in LAYERS: `exporter.sources.redis_keys.groups` is in
    `sources.redis_keys`, `exporter.sources.runner` in `sources`, `exporter` is its own."""
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE
    if ".".join(parts[:2]) in LAYERS:  # a source kind
        return ".".join(parts[:2])
    return parts[0]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports: `from a.b import c` counts a.b.c when c is a
    module, else a.b; a relative import is resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in names:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def layers(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each module's layer: 0 for one importing no module of the package, else one above the
    highest it imports. Only defined without circles."""
    layer: dict[str, int] = {}

    def place(node: str) -> int:
        if node not in layer:
            layer[node] = 1 + max((place(target) for target in edges[node]), default=-1)
        return layer[node]

    for node in edges:
        place(node)
    return layer


def test_the_walk_finds_a_circle_and_imports_under_type_checking():
    """The checker itself: a circle closed only by a TYPE_CHECKING import is found."""
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from exporter.b import X\n"
    tree = ast.parse(source)
    targets = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "exporter.b" in targets
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    edges = graph()
    assert len(edges) > 20  # the walk did find the package
    found = circles(edges)
    if not found:
        by_layer: dict[int, list[str]] = {}
        for name, level in layers(edges).items():
            by_layer.setdefault(level, []).append(name)
        for level in sorted(by_layer):
            print(f"layer {level}: {' '.join(sorted(by_layer[level]))}")
    assert found == [], "import circles: " + "; ".join(" <-> ".join(group) for group in found)


def test_every_package_is_in_the_table():
    found = {package_of(name) for name in modules()} - {PACKAGE}
    assert found == set(LAYERS), f"packages not in LAYERS: {found - set(LAYERS)}"


def test_the_table_itself_runs_one_way():
    assert circles({name: set(below) for name, below in LAYERS.items()}) == []


def test_each_package_imports_only_what_the_table_allows():
    wrong = []
    for name, targets in graph().items():
        here = package_of(name)
        for target in targets:
            there = package_of(target)
            if there not in (here, PACKAGE) and there not in LAYERS[here]:
                wrong.append(f"{name} -> {target} ({here} may not import {there})")
    assert wrong == []


def test_among_the_sources_only_the_runner_imports_telemetry():
    importers = {
        name
        for name, targets in graph().items()
        if name.startswith("exporter.sources") and TELEMETRY in targets
    }
    assert importers == TELEMETRY_AMONG_THE_SOURCES
