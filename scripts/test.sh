#!/usr/bin/env bash
# The test suite against the real Redis, PostgreSQL and Prometheus tools. Arguments go to pytest:
#   scripts/test.sh                          # all of it, 6 workers (pytest-xdist, docs/testing.md)
#   scripts/test.sh -k foo | tests/test_x.py # a part: serially, so it starts in seconds
#   QE_TEST_WORKERS=2 scripts/test.sh ...    # or -n N: that many workers whatever is asked
set -euo pipefail
cd "$(dirname "$0")/.."
# .ci/run has run the set-up already; on a warm machine it only checks (about a second).
[ "${QE_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Workers pay off for the whole suite; for a part, starting them (each collects every test)
# costs more than they save.
workers=6
for argument in "$@"; do
  case $argument in -k | -m | tests/* | ./tests/*) workers=0 ;; esac
done
exec .venv/bin/python -m pytest -n "${QE_TEST_WORKERS:-$workers}" --dist loadgroup "$@"
