"""Write docs/metrics.md and docs/presets.md from the code: the metric catalog and the presets.

.venv/bin/python scripts/generate_reference.py           # rewrite the files
.venv/bin/python scripts/generate_reference.py --check   # fail when a committed file is stale
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import catalog, presets

ROOT = Path(__file__).resolve().parent.parent
ORIGINS = {
    "sampled": "Sampled from Redis keys and PostgreSQL",
    "events": "Derived from lifecycle events",
    "self": "The exporter's own",
}


def metrics_page() -> str:
    lines = [
        "# Metric reference",
        "",
        "Generated from `exporter/catalog.py` by `scripts/generate_reference.py`; do not edit.",
        "Label values absent for a series are empty strings (which Prometheus treats as absent).",
        "",
    ]
    for origin, title in ORIGINS.items():
        lines += [f"## {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for spec in (spec for spec in catalog.ALL if spec.origin == origin):
            meaning = spec.help
            if spec.buckets:
                meaning += " Buckets: " + ", ".join(f"{bound:g}" for bound in spec.buckets) + "."
            labels = ", ".join(spec.labels) or "—"
            lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def presets_page() -> str:
    lines = [
        "# Presets",
        "",
        "Generated from `exporter/presets/*.yaml` by `scripts/generate_reference.py`; do not edit.",
        "A preset is a piece of configuration: `--preset NAME`, or in the file",
        "`presets: [{name: NAME, params: {...}}]` to override its params. Key groups use the same",
        "format as an operator's own (`sources.redis.key_groups`, see the README).",
        "",
    ]
    for name in presets.available():
        document = presets.read(name)
        lines += [f"## `{name}`", "", presets.describe(name), ""]
        params = document.get("params") or {}
        if params:
            lines.append(
                "Params: " + ", ".join(f"`{k}` (default `{v}`)" for k, v in params.items())
            )
            lines.append("")
        groups = document.get("sources", {}).get("redis", {}).get("key_groups", [])
        if groups:
            lines += ["| key pattern | type | state | reads |", "|---|---|---|---|"]
            lines += [_group_row(group) for group in groups]
            lines.append("")
        for section in sorted(set(document.get("sources", {})) - {"redis"}):
            lines += [f"It also configures `sources.{section}` (see docs/{section}.md).", ""]
    return "\n".join(lines)


def _group_row(group: dict[str, Any]) -> str:
    reads = ["depth"]
    if group.get("priority_bands"):
        reads.append("priority from score bands")
    oldest = group.get("oldest")
    if oldest:
        where = oldest.get("field") or oldest["time_in"]
        reads.append(f"head age ({oldest.get('end', 'head')}, {where})")
    if group.get("due"):
        reads.append(f"`{group['due']['metric']}`")
    if group.get("max_depth") is not None:
        reads.append("`queue_max_depth`")
    pattern = repr(group["pattern"])[1:-1].replace("|", "\\|")
    return f"| `{pattern}` | {group['type']} | {group['state']} | {', '.join(reads)} |"


PAGES = {"docs/metrics.md": metrics_page, "docs/presets.md": presets_page}


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for relative, render in PAGES.items():
        path = ROOT / relative
        text = render()
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(relative)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run scripts/generate_reference.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
