"""The lowest version of every runtime dependency pyproject.toml allows, and of the extras a
sidecar runs with (FLOOR_EXTRAS), as pip requirements.

    python3 scripts/floors.py > floors.txt && pip install -r floors.txt

`name>=X` (or `==X`) becomes `name==X`, extras kept; CI installs these in a venv of their own
and runs a smoke subset of the tests there (scripts/setup.sh, .ci/run), so a floor that no
longer works fails CI instead of a user's install.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

# What a sidecar may run with beside its dependencies: the OTLP push (`otlp.enabled`), whose
# modules tests/runtime/test_imports.py finds loaded when a configuration uses it.
FLOOR_EXTRAS = ("otlp",)

_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.\[\],-]+?)\s*(?P<specifiers>[<>=!~].*)?$")


def floor(requirement: str) -> str:
    match = _REQUIREMENT.match(requirement.split(";")[0].strip())
    if match is None or not match.group("specifiers"):
        raise ValueError(f"{requirement!r}: no lower bound to install")
    for specifier in match.group("specifiers").split(","):
        bound = re.fullmatch(r"(>=|==|~=)\s*(\S+)", specifier.strip())
        if bound is not None:
            return f"{match.group('name')}=={bound.group(2)}"
    raise ValueError(f"{requirement!r}: no lower bound to install")


def main() -> None:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for requirement in project["project"]["dependencies"]:
        print(floor(requirement))
    for extra in FLOOR_EXTRAS:
        for requirement in extras[extra]:
            print(floor(requirement))


if __name__ == "__main__":
    main()
