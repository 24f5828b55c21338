"""The generated reference pages match the code they are generated from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

ROOT = Path(__file__).resolve().parents[2]


def test_metric_and_preset_pages_are_current():
    result = subprocess.run(
        [sys.executable, "scripts/generate_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_catalog_metric_is_documented():
    from exporter.output import catalog

    page = (ROOT / "docs" / "metrics.md").read_text()
    for spec in catalog.ALL:
        assert f"| `{spec.name}` |" in page


def test_optional_sections_say_what_unset_means():
    """The events Redis defaults to sources.redis's connection, not to the URL default its
    rows show once the section is set."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert (
        "| `sources.events.redis` | section | unset | where the streams live "
        "(default: sources.redis's connection)" in page
    )
