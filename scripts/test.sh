#!/usr/bin/env bash
# The whole test suite against the real Redis, PostgreSQL and Prometheus tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
