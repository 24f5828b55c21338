"""Copy the generated dashboards into the Helm chart, which can only read files inside its own
directory: dashboards/*.json -> helm/queue-exporter/files/dashboards/. Copies of files that are
gone are removed. With --check, change nothing and exit 1 when the chart's copies are out of
date. (The chart's rules are not a copy: `python -m alerts` writes them with a token for each
setting the chart's values change.)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = ROOT / "helm" / "queue-exporter" / "files"
# (source directory, glob, destination directory)
SYNCED = ((ROOT / "dashboards", "*.json", CHART_FILES / "dashboards"),)


def differences() -> list[str]:
    """What --check reports: one line per copy that is missing, stale or left over."""
    problems = []
    for source_dir, pattern, target_dir in SYNCED:
        sources = {path.name: path for path in sorted(source_dir.glob(pattern))}
        copies = {path.name: path for path in sorted(target_dir.glob(pattern))}
        for name, source in sources.items():
            copy = copies.get(name)
            if copy is None:
                problems.append(f"missing: {_relative(target_dir / name)}")
            elif copy.read_bytes() != source.read_bytes():
                problems.append(f"stale: {_relative(copy)} differs from {_relative(source)}")
        problems += [f"left over: {_relative(copies[name])}" for name in copies.keys() - sources]
    return problems


def sync() -> list[str]:
    """Make the chart's copies equal the sources; return what changed."""
    changed = differences()
    for source_dir, pattern, target_dir in SYNCED:
        target_dir.mkdir(parents=True, exist_ok=True)
        sources = {path.name for path in source_dir.glob(pattern)}
        for copy in target_dir.glob(pattern):
            if copy.name not in sources:
                copy.unlink()
        for name in sorted(sources):
            shutil.copyfile(source_dir / name, target_dir / name)
    return changed


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences, change nothing")
    args = parser.parse_args()
    if args.check:
        problems = differences()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python scripts/sync_chart_files.py", file=sys.stderr)
        return 1 if problems else 0
    for line in sync():
        print(f"synced ({line})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
