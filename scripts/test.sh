#!/usr/bin/env bash
# The test suite against the real Redis, PostgreSQL and Prometheus tools. Arguments go to pytest:
#   scripts/test.sh                          # all of it, 6 workers (pytest-xdist, docs/testing.md)
#   scripts/test.sh -k foo | tests/test_x.py # a part: serially, so it starts in seconds
#   QE_TEST_WORKERS=2 scripts/test.sh ...    # or -n N: that many workers whatever is asked
#   scripts/test.sh --fast [ARGS]            # the fast tier: the tests marked fast, no server
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The fast tier (docs/testing.md): serially (workers cost more than they save here), needing
# only the project's venv; tests/fast_tier.py fails a marked test that reaches a server.
if [ "${1:-}" = --fast ]; then
  shift
  started=$EPOCHREALTIME
  [ "${QE_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh --fast
  status=0
  .venv/bin/python -m pytest -m fast -n "${QE_TEST_WORKERS:-0}" "$@" || status=$?
  awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "test.sh --fast: %.1f s, set-up included\n", b - a }'
  exit "$status"
fi

# .ci/run has run the set-up already; on a warm machine it only checks (about a second).
[ "${QE_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh

# Workers pay off for the whole suite; for a part, starting them (each collects every test)
# costs more than they save.
workers=6
for argument in "$@"; do
  case $argument in -k | -m | tests/* | ./tests/*) workers=0 ;; esac
done
exec .venv/bin/python -m pytest -n "${QE_TEST_WORKERS:-$workers}" --dist loadgroup "$@"
