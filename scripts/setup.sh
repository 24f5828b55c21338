#!/usr/bin/env bash
# Idempotent set-up for tests and benchmarks: a virtualenv with every extra, the Debian tools
# the tests call, and the local Redis and PostgreSQL started when they are not running.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_TOOLS=(prometheus prometheus-alertmanager nodejs npm ruby-sidekiq chromium
  prometheus-redis-exporter)
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
# real BullMQ (npm, run with Node) and Sidekiq (ruby) for the preset tests
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v sidekiq >/dev/null || missing+=(ruby-sidekiq)
command -v chromium >/dev/null || missing+=(chromium) # tests/test_status_page.py
command -v ss >/dev/null || missing+=(iproute2) # tests/test_http_attacks.py: the listen backlog
# the Go peer bench/key_sampling.py compares the key sampler with
command -v prometheus-redis-exporter >/dev/null || missing+=(prometheus-redis-exporter)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing ${missing[*]} (of ${DEBIAN_TOOLS[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian starts the services it installs, but the tests run their own instances: a
  # policy-rc.d answering 101 ("action forbidden") keeps invoke-rc.d from starting any.
  policy=/usr/sbin/policy-rc.d
  made_policy=false
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=true
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$made_policy" = true ]; then rm -f "$policy"; fi
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "setup: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  echo "setup: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
for _ in $(seq 50); do
  redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && pg_isready -h 127.0.0.1 >/dev/null 2>&1 && break
  sleep 0.2
done

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

# checkov (the chart's security checks) in a venv of its own: it pins packaging<24, which
# pytest 9 refuses, so it cannot share the project's venv.
if [ ! -x .venv/tools/checkov/bin/checkov ]; then
  python3 -m venv .venv/tools/checkov
  .venv/tools/checkov/bin/python -m pip install -q 'checkov==3.3.30'
fi

# The lowest version of every dependency pyproject.toml allows (scripts/floors.py), in a venv
# of their own: .ci/run runs a smoke subset of the tests there, so a floor that stopped
# working fails CI. Made again when the floors change.
floors=.venv/tools/floors
wanted=$(.venv/bin/python scripts/floors.py)
if [ "$wanted" != "$(cat "$floors/requirements.txt" 2>/dev/null)" ]; then
  rm -rf "$floors"
  python3 -m venv "$floors"
  printf '%s\n' "$wanted" >"$floors/wanted.txt"
  "$floors/bin/python" -m pip install -q -r "$floors/wanted.txt" pytest pytest-timeout
  mv "$floors/wanted.txt" "$floors/requirements.txt"
fi

# RQ 2.x and 1.x, each in a venv of its own (the project's venv has RQ 3 from the dev extra):
# tests/test_native_rq.py runs producers, workers and RQ's own counts under every major.
for major in 2 1; do
  if [ ! -x ".venv/tools/rq${major}/bin/rq" ]; then
    python3 -m venv ".venv/tools/rq${major}"
    ".venv/tools/rq${major}/bin/python" -m pip install -q "rq>=${major},<$((major + 1))"
  fi
done

# arq pins redis-py below 6 (the project's venv has 8.x): a venv of its own, pinned, for
# tests/test_preset_arq.py's producers, `arq` workers and arq's own view of the queues.
if [ ! -x .venv/tools/arq/bin/arq ]; then
  python3 -m venv .venv/tools/arq
  .venv/tools/arq/bin/python -m pip install -q 'arq==0.28.0'
fi

# Dramatiq 1.x beside the dev extra's 2.x, in a venv of its own (tests/test_preset_dramatiq.py)
if [ ! -x .venv/tools/dramatiq1/bin/dramatiq ]; then
  python3 -m venv .venv/tools/dramatiq1
  .venv/tools/dramatiq1/bin/python -m pip install -q 'dramatiq[redis]==1.18.0'
fi

# BullMQ 5.x and 6.x for the tests, each in its folder from its committed package-lock.json
for bullmq in tests/node/bullmq5 tests/node/bullmq6; do
  if [ ! -d "$bullmq/node_modules/bullmq" ]; then
    (cd "$bullmq" && npm ci --no-audit --no-fund --silent)
  fi
done
