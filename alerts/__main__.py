"""`python -m alerts`: write (or --check) the committed rules, runbook and the chart's rules; or,
with --output FILE, write rules fitted to your setup (job, runbook URL, thresholds) for a plain
Prometheus, leaving the committed files alone.

    python -m alerts --output queue-exporter.rules.yml --job my-queues \
        --runbook-url-base https://wiki.example.org/queue-exporter/runbook.md \
        --set oldest_age_seconds=600 --set failure_ratio=0.2 --values thresholds.yml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from alerts.config import DEFAULTS, THRESHOLDS, RulesConfig, with_settings
from alerts.generate import REPO, outputs, render_rules


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m alerts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    parser.add_argument("--output", type=Path, help="write only the rules, fitted, to FILE")
    parser.add_argument("--job", help='the scrape job\'s name (default "queue-exporter")')
    parser.add_argument(
        "--runbook-url-base", help=f"where runbook_url points ({DEFAULTS.runbook_url_base})"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a threshold or `for` duration: {', '.join(THRESHOLDS)}",
    )
    parser.add_argument(
        "--values", type=Path, help="a YAML mapping of the same names (job, runbook_url_base too)"
    )
    args = parser.parse_args()
    try:
        config = _config(args)
    except (ValueError, OSError, yaml.YAMLError) as error:
        parser.error(str(error))
    if args.output is not None:
        args.output.write_text(render_rules(config))
        print(f"wrote {args.output}")
        return 0
    if config != DEFAULTS:
        parser.error(
            "settings change the committed files only through alerts/config.py: use --output"
        )
    return _write_committed(args.check)


def _config(args: argparse.Namespace) -> RulesConfig:
    settings: dict[str, Any] = {}
    if args.values is not None:
        loaded = yaml.safe_load(args.values.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.values}: the top level must be a mapping of settings")
        settings.update(loaded)
    for pair in args.set:
        name, equals, value = pair.partition("=")
        if not equals:
            raise ValueError(f"--set {pair}: expected NAME=VALUE")
        settings[name.strip()] = value.strip()
    if args.job is not None:
        settings["job"] = args.job
    if args.runbook_url_base is not None:
        settings["runbook_url_base"] = args.runbook_url_base
    return with_settings(DEFAULTS, settings)


def _write_committed(check: bool) -> int:
    stale = []
    for path, text in outputs(DEFAULTS).items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(path.relative_to(REPO))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(
            "out of date (run `python -m alerts`): " + ", ".join(map(str, stale)), file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
