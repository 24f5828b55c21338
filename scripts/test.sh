#!/usr/bin/env bash
# The whole test suite against the real Redis, PostgreSQL and Prometheus tools, in parallel
# (pytest-xdist, groups kept on one worker: docs/testing.md). Arguments go to pytest:
#   scripts/test.sh -k foo | scripts/test.sh tests/test_http.py | scripts/test.sh -n 0 (serial)
set -euo pipefail
cd "$(dirname "$0")/.."
# .ci/run has run the set-up already; on a warm machine it only checks (about a second).
[ "${QE_SETUP_DONE:-}" = 1 ] || bash scripts/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m pytest -n "${QE_TEST_WORKERS:-4}" --dist loadgroup "$@"
