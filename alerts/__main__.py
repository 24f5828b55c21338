"""`python -m alerts [--check] [--runbook-url-base URL]`: write (or check) the rules and runbook."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from alerts.config import DEFAULTS
from alerts.generate import REPO, outputs


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    parser.add_argument(
        "--runbook-url-base",
        help="where runbook_url points (default: %(default)s)",
        default=DEFAULTS.runbook_url_base,
    )
    args = parser.parse_args()
    config = dataclasses.replace(DEFAULTS, runbook_url_base=args.runbook_url_base)
    stale = []
    for path, text in outputs(config).items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
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
