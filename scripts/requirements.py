"""The requirements pyproject.toml names for some extras, the project itself left out.

    python3 scripts/requirements.py dev

scripts/setup.sh installs these (under constraints/dev.txt) in a venv cached outside the clone
and shared by every clone needing the same; the clone itself is put on that venv's path, not
installed, so each clone imports its own `exporter`. An extra naming the project's own extras
(`queue-exporter[otlp,chart]`) is expanded.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any


def requirements(project: dict[str, Any], extras: list[str]) -> list[str]:
    own = re.compile(rf"{re.escape(project['name'])}\[(?P<extras>[^]]*)\]")
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    found = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r} (has: {', '.join(optional)})")
        seen.add(extra)
        for requirement in optional[extra]:
            match = own.fullmatch(requirement.replace(" ", ""))
            if match is None:
                found.append(requirement)
            else:
                pending.extend(match.group("extras").split(","))
    return found


def main() -> None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    for requirement in requirements(project, sys.argv[1:]):
        print(requirement)


if __name__ == "__main__":
    main()
