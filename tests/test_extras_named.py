"""The docs and `queue-exporter presets` name only extras pyproject.toml has: a user told to
install an extra that does not exist gets pip's warning and none of what they were promised."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# "the celery extra", "extras celery", ".[demo]", "queue-exporter[otlp,chart]"
_NAMED = (
    re.compile(r"\bthe ([a-z][a-z0-9_-]*) extra\b"),
    re.compile(r"\bextras? `?([a-z][a-z0-9_-]*)`?"),
    re.compile(r"(?:\.|queue-exporter)\[([a-z0-9_,\s-]+)\]"),
)


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def _named(text: str) -> set[str]:
    names: set[str] = set()
    for pattern in _NAMED:
        for match in pattern.finditer(text):
            names.update(name.strip() for name in match.group(1).split(","))
    return names - {"package"}  # "no extra package"


def test_docs_and_presets_name_only_existing_extras():
    listed = subprocess.run(
        [sys.executable, "-m", "exporter", "presets"], capture_output=True, text=True, check=True
    ).stdout
    texts = {"queue-exporter presets": listed, "README.md": (ROOT / "README.md").read_text()}
    for path in [*(ROOT / "docs").glob("*.md"), *(ROOT / "helm").rglob("README.md")]:
        texts[str(path.relative_to(ROOT))] = path.read_text()
    extras = _extras()
    assert {"otlp", "demo"} <= _named(texts["README.md"])  # the patterns find what is there
    unknown = {where: _named(text) - extras for where, text in texts.items()}
    assert not {where: names for where, names in unknown.items() if names}, extras
