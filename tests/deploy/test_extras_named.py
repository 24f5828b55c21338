"""The docs and `queue-exporter presets` name only extras pyproject.toml has: a user told to
install an extra that does not exist gets pip's warning and none of what they were promised."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

ROOT = Path(__file__).resolve().parents[2]
# "the celery extra", "its `otlp` extra", "extras `demo`", ".[demo]", "queue-exporter[otlp,chart]".
# A bare word after "extra" is not read as a name: it is as often English ("its `otlp` extra from PyPI").
_NAMED = (
    re.compile(r"\bthe `?([a-z][a-z0-9_-]*)`? extra\b"),
    re.compile(r"`([a-z][a-z0-9_-]*)` extras?\b"),
    re.compile(r"\bextras? `([a-z][a-z0-9_-]*)`"),
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
    return names


def test_docs_and_presets_name_only_existing_extras():
    listed = subprocess.run(
        [sys.executable, "-m", "exporter", "presets"], capture_output=True, text=True, check=True
    ).stdout
    texts = {"queue-exporter presets": listed, "README.md": (ROOT / "README.md").read_text()}
    for path in [*(ROOT / "docs").glob("*.md"), *(ROOT / "helm").rglob("README.md")]:
        texts[str(path.relative_to(ROOT))] = path.read_text()
    extras = _extras()
    assert {"otlp", "demo"} <= _named(texts["README.md"])  # the patterns find what is there
    every_form = "the nosuch1 extra, its `nosuch2` extra, extras `nosuch3`, '.[nosuch4,nosuch5]'"
    assert _named(every_form) == {f"nosuch{n}" for n in range(1, 6)}
    english = "its `otlp` extra from PyPI, no extra package"  # not "from", not "package"
    assert _named(english) == {"otlp"}
    unknown = {where: _named(text) - extras for where, text in texts.items()}
    assert not {where: names for where, names in unknown.items() if names}, extras
