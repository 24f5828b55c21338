"""The repository carries everything its tests need: a clone with nothing beside it runs them.

The seed documents live outside the repository (beside CI's clone); the facts the tests take
from them are kept in tests/seed_facts.json, and only scripts/seed_facts.py, which compares the
two where the documents are present, and .ci/run, which runs that comparison, look outside.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What may name a place outside the repository, and why.
LOOKS_OUTSIDE = {
    "scripts/seed_facts.py": "compares tests/seed_facts.json with the documents where present",
    ".ci/run": "runs that comparison as its own step",
    "tests/runtime/test_self_contained.py": "this test, which names the patterns",
}
# A relative path up out of the clone, the folder beside it, or a path built above the root.
LEAVING = re.compile(r"\.\./|\bshared/|QE_SHARED_DIR|ROOT\.parent")
# A path built from the file's own place: `.parent` hops or `.parents[n]` (n + 1 hops).
FROM_FILE = re.compile(r"Path\(__file__\)\.resolve\(\)((?:\.parent\b)+|\.parents\[(\d+)\])")


def _above_the_root(path: str, line: str) -> bool:
    """Whether a path built from `path`'s own place climbs above the repository's root (a file
    n folders deep reaches the root in n + 1 hops)."""
    for match in FROM_FILE.finditer(line):
        hops = int(match.group(2)) + 1 if match.group(2) else match.group(1).count(".parent")
        if hops > len(Path(path).parts):
            return True
    return False


def _tracked(*folders: str) -> list[str]:
    """Files git tracks or would track (new ones not ignored) under `folders`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *folders],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return sorted({path for path in listed if (ROOT / path).is_file()})


def test_nothing_in_tests_scripts_or_ci_names_a_path_outside_the_repository() -> None:
    offenders = []
    for path in _tracked("tests", "scripts", ".ci"):
        if path in LOOKS_OUTSIDE:
            continue
        try:
            text = (ROOT / path).read_text()
        except UnicodeDecodeError:
            continue  # a binary file names no path
        offenders += [
            f"{path}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if LEAVING.search(line) or _above_the_root(path, line)
        ]
    assert not offenders, "\n".join(offenders)


def test_a_clone_with_nothing_beside_it_runs_the_seed_tests(tmp_path: Path) -> None:
    """The tests that take the seeds' facts (Orchestrata's and Runner-Q's keys, Attune's DDL),
    run in a copy of the repository whose folder holds nothing else, without QE_SHARED_DIR."""
    clone = tmp_path / "alone" / "clone"
    for path in _tracked("tests", "exporter", "scripts", "pyproject.toml"):
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, clone / path)
    env = {key: value for key, value in os.environ.items() if key != "QE_SHARED_DIR"}
    env["PYTHONPATH"] = str(clone)

    check = subprocess.run(
        [sys.executable, "scripts/seed_facts.py"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "no shared/seeds/ beside the clone" in check.stdout, check.stdout

    tests = [
        "tests/sources/redis_keys/test_seed_layouts.py",
        "tests/config/test_presets.py::test_runnerq",
        "tests/sources/redis_keys/test_recorded_replies.py",  # the seeds' layouts, recorded
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert re.search(r"^\d+ passed", run.stdout.splitlines()[-1]), tail
