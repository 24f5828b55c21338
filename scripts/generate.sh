#!/usr/bin/env bash
# Regenerate everything built from code: dashboards/*.json, alerts/queue-exporter.rules.yml,
# docs/runbook.md, and the Helm chart's copies of them. `--check` changes nothing and fails
# when a committed file is out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m dashboards "$@"
"$PYTHON" -m alerts "$@"
if [ -f scripts/sync_chart_files.py ]; then
  "$PYTHON" scripts/sync_chart_files.py "$@"
fi
