#!/usr/bin/env bash
# Idempotent set-up for tests and benchmarks, one line per step:
#   1. the Debian tools the tests call (DEBIAN_TOOLS), installed with apt-get when missing;
#   2. the local Redis and PostgreSQL, started when they are down and proven to answer;
#   3. the Python venvs (the project's, TOOL_VENVS, the dependency floors) and the node folders
#      (tests/node/*), each built once in a cache outside the clone ($QE_CACHE, default
#      ~/.cache/queue-exporter) under the hash of what it installs, then linked into the clone.
# On a machine where all of it is there, nothing is downloaded and it takes about a second.
#   scripts/setup.sh --fast   # the fast tier's (scripts/test.sh --fast): the project's venv
#                             # alone; no Debian tool, no server, no other venv or node folder
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${QE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queue-exporter}
PYTHON=${PYTHON:-python3}

say() { printf 'setup: %s\n' "$*"; }
die() {
  printf 'setup: FAILED: %s\n' "$*" >&2
  exit 1
}

# --- 1. Debian tools: "command package what-for". A tool the tests call gets a line here.
DEBIAN_TOOLS=(
  "redis-server redis-server the Redis the tests run (the shared one and private servers)"
  "redis-cli redis-tools this script's check that Redis answers"
  "pg_ctlcluster postgresql the PostgreSQL the tests create databases in"
  "psql postgresql-client this script's check that PostgreSQL lets the tests in"
  "promtool prometheus alert rules and the Prometheus end-to-end tests"
  "prometheus prometheus the Prometheus end-to-end tests"
  "amtool prometheus-alertmanager the Alertmanager configuration checks"
  "node nodejs real BullMQ producers and workers (tests/node)"
  "npm npm the BullMQ folders from their package-lock.json"
  "sidekiq ruby-sidekiq real Sidekiq workers"
  "chromium chromium the status page in a real browser"
  "ss iproute2 the listen backlog in tests/http/test_http_attacks.py"
  "prometheus-redis-exporter prometheus-redis-exporter the Go peer bench/key_sampling.py compares with"
  "flock util-linux one build of a cached venv at a time"
  "podman podman the image tests/deploy/test_image.py builds and runs (no Docker daemon)"
  "buildah buildah the image built from the Dockerfile (scripts/build-image.sh)"
  "runc runc the OCI runtime podman runs the image with"
  "debootstrap debootstrap the stand-in base when python:3.11-slim-bookworm cannot be pulled"
  "docker-registry docker-registry the registry tests/deploy/test_image.py pushes the image to"
)

# Python tools in venvs of their own, their pins conflicting with the project's venv:
# "name what-pip-installs..." each pinned whole in constraints/<name>.txt. A new one: a line
# here and its constraints file; a test finds it at .venv/tools/<name>.
TOOL_VENVS=(
  "checkov checkov==3.3.30" # the chart's security checks: pins packaging<24, pytest 9 refuses that
  "rq2 rq>=2,<3"            # tests/conformance/ (rq): RQ's own counts under every major
  "rq1 rq>=1,<2"
  "arq arq==0.28.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-instrumentation-arq==0.50b1" # pins redis-py below 6: tests/conformance/ (arq), tests/hooks/ (OpenTelemetry)
  "dramatiq1 dramatiq[redis]==1.18.0" # Dramatiq 1.x beside the dev extra's 2.x
  "huey2 huey==2.6.0 redis==8.1.0"    # Huey 2.x beside the dev extra's 3.x
  "taskiq taskiq-redis==1.2.4 taskiq==0.13.0" # tests/conformance/ (taskiq): aiohttp, pycron
  # tests/conformance/ (django_q): Django 5.2 and real qcluster workers, kept apart from
  # the project's venv (Django is no dependency of the exporter)
  "djangoq django-q2==1.11.1 Django==5.2.19 redis==8.2.0 psycopg[binary]==3.3.9"
  "pgqueuer1 pgqueuer[asyncpg]==1.6.0" # pins pydantic, typer, uvloop: tests/conformance/ (pgqueuer)
  "oban oban==0.7.0"                  # Oban's Python (needs 3.12+): tests/conformance/ (oban)
  # Django's tasks (the django-tasks backport, its database backend django-tasks-db) on
  # Django 5.2: a venv of its own, so no Django comes into the project's venv
  "djangotasks django==5.2.19 django-tasks==0.12.0 django-tasks-db==0.13.0 psycopg[binary]==3.3.9"
)
# Tool venvs whose library needs a newer Python than the project's: "name major.minor".
TOOL_PYTHONS=(
  "oban 3.12"
)

install_debian_tools() {
  local entry command package why missing=()
  for entry in "${DEBIAN_TOOLS[@]}"; do
    read -r command package why <<<"$entry"
    if ! command -v "$command" >/dev/null; then
      say "missing: $command (Debian package $package) for $why"
      missing+=("$package")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    say "Debian tools: all ${#DEBIAN_TOOLS[@]} present"
    return
  fi
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
    die "install ${missing[*]} (as root: apt-get install ${missing[*]}), then run this again"
  fi
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed (no network or no package source?)"
  # Debian starts the services it installs, but the tests run their own instances: a
  # policy-rc.d answering 101 ("action forbidden") keeps invoke-rc.d from starting any.
  local policy=/usr/sbin/policy-rc.d made_policy=false
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=true
  fi
  local status=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
  if [ "$made_policy" = true ]; then rm -f "$policy"; fi
  [ "$status" -eq 0 ] || die "apt-get install ${missing[*]} failed"
  for entry in "${DEBIAN_TOOLS[@]}"; do
    read -r command package why <<<"$entry"
    command -v "$command" >/dev/null || die "$command still missing after installing $package"
  done
}

# --- 2. Services: the shared Redis and PostgreSQL the tests use (tests/conftest.py).
wait_until() { # name seconds command...: fail naming `name` when command never succeeds
  local name=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$name did not come up within ${seconds} s"
    sleep 0.2
  done
}

redis_answers() { [ "$(redis-cli -h "$1" -p "$2" ping 2>/dev/null)" = PONG ]; }

start_redis() {
  local host=${QE_TEST_REDIS_HOST:-127.0.0.1} port=${QE_TEST_REDIS_PORT:-6379}
  if redis_answers "$host" "$port"; then
    say "Redis $host:$port: answers"
    return
  fi
  [ "$host:$port" = 127.0.0.1:6379 ] || die "Redis at $host:$port (QE_TEST_REDIS_HOST/PORT) does not answer PING"
  say "Redis $host:$port: starting redis-server"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log ||
    die "redis-server would not start (its log: /var/log/redis/ci.log)"
  wait_until "Redis on $host:$port (its log: /var/log/redis/ci.log)" 15 redis_answers "$host" "$port"
}

start_postgres() {
  local dsn=${QE_TEST_POSTGRES_DSN:-host=127.0.0.1 port=5432 user=postgres dbname=postgres}
  local shown
  shown=$(sed -E 's/password=[^ ]*/password=***/' <<<"$dsn")
  if [ -z "${QE_TEST_POSTGRES_DSN:-}" ] && ! pg_isready -q -h 127.0.0.1 -p 5432; then
    local version
    version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -1)
    [ -n "$version" ] || die "no PostgreSQL cluster in /etc/postgresql (apt-get install postgresql makes one)"
    say "PostgreSQL $version/main: starting"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
      die "pg_ctlcluster $version main start failed (its log: /var/log/postgresql/)"
    wait_until "PostgreSQL on 127.0.0.1:5432" 30 pg_isready -q -h 127.0.0.1 -p 5432
  fi
  # The tests connect without a password prompt and create databases of their own.
  PGCONNECT_TIMEOUT=5 psql -w -XAtq "$dsn" -c 'SELECT 1' >/dev/null 2>&1 ||
    die "PostgreSQL refuses '$shown' without a password prompt: trust 127.0.0.1 for user postgres in pg_hba.conf, or set QE_TEST_POSTGRES_DSN with a password= of a user allowed CREATE DATABASE"
  say "PostgreSQL '$shown': answers"
}

# --- 3. Cached venvs: built once per hash of (Python, what pip installs, its constraints file).
python_tag=$("$PYTHON" -c 'import sys; print(sys.version)' 2>/dev/null) ||
  die "$PYTHON not found: Python 3.11 or newer (Debian packages python3 python3-venv)"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || die "$PYTHON cannot make venvs: apt-get install python3-venv"

# python_of VERSION: the path of a Python VERSION (e.g. 3.12) that runs: pythonVERSION on the
# PATH (Debian's, or pyenv's shim when that version is selected), else pyenv's install of it.
python_of() {
  local version=$1 candidate root
  for candidate in "python$version" "python3" "$PYTHON"; do
    if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in "$root"/versions/"$version".*/bin/python"$version"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import ensurepip, venv' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  return 1
}

# cached_venv NAME CONSTRAINTS PIP-ARGS...: a venv holding `pip install PIP-ARGS` (under the
# CONSTRAINTS file unless it is "-"), its path in $VENV; made with $VENV_PYTHON when set
# (a tool needing another Python), else $PYTHON.
cached_venv() {
  local name=$1 constraints=$2
  shift 2
  local python=${VENV_PYTHON:-$PYTHON} python_tag=$python_tag
  [ -z "${VENV_PYTHON:-}" ] || python_tag=$("$python" -c 'import sys; print(sys.version)')
  local pins=()
  [ "$constraints" = - ] || [ -f "$constraints" ] ||
    die "venv $name: no $constraints (each venv is pinned whole: its pip freeze, see docs/testing.md)"
  [ "$constraints" = - ] || pins=(-c "$constraints")
  local key
  key=$({ printf '%s\n' "$python_tag" "$@"; [ "$constraints" = - ] || cat "$constraints"; } |
    sha256sum | cut -c1-16)
  VENV=$CACHE/venv/$name-$key
  if [ -e "$VENV/.complete" ]; then
    say "venv $name: cached ($VENV)"
    return
  fi
  mkdir -p "$CACHE/venv"
  (
    flock 9
    [ -e "$VENV/.complete" ] && exit 0
    say "venv $name: building $VENV"
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
    pip_install "${pins[@]}" pip || die "venv $name: pip could not install pip"
    pip_install "${pins[@]}" "$@" ||
      die "venv $name: pip could not install $* (no network or no package index?)"
    [ "$constraints" = - ] || check_pinned "$name" "$constraints"
    touch "$VENV/.complete"
  ) 9>"$VENV.lock"
}

pip_install() { # pip install into $VENV, without the notes about package sources it skips
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
  return "${PIPESTATUS[0]}"
}

check_pinned() { # every package installed in $VENV has its line in the constraints file
  local name=$1 constraints=$2 unpinned
  unpinned=$("$VENV/bin/python" -m pip freeze --exclude-editable |
    grep -v -i -x -F -f <(grep -v '^#' "$constraints") || true)
  [ -z "$unpinned" ] || die "venv $name: not pinned in $constraints (add these lines): $unpinned"
}

# The clone's .venv: a light venv whose site-packages chains to the cached one and puts the
# clone itself first on the path (what an editable install does), so every clone imports its
# own `exporter`; the cached venv's commands run with it; .venv/tools/<name> link the tools.
link_venv() {
  local marker=.venv/queue-exporter-cache
  if [ -L .venv ] || { [ -e .venv ] && [ ! -e "$marker" ]; }; then
    say ".venv: not made by this script (a link or an older venv), used as it is"
    return
  fi
  local made_by
  made_by="$VENV $(sha256sum <scripts/setup.sh | cut -c1-16)" # a new setup.sh makes it again
  if [ "$(cat "$marker" 2>/dev/null)" = "$made_by" ]; then
    say ".venv: linked to $VENV"
    return
  fi
  rm -rf .venv
  "$PYTHON" -m venv --without-pip .venv
  local purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  local site cached_site
  site=$(.venv/bin/python -c "$purelib")
  cached_site=$("$VENV/bin/python" -c "$purelib")
  printf '%s\nimport site; site.addsitedir(%s)\n' "$ROOT" "'$cached_site'" >"$site/queue_exporter.pth"
  local command name
  for command in "$VENV"/bin/*; do
    name=${command##*/}
    case $name in python* | activate* | pip* | Activate*) continue ;; esac
    if head -n1 "$command" | grep -q '^#!.*python'; then
      printf '#!/bin/sh\nexec "%s/.venv/bin/python" "%s" "$@"\n' "$ROOT" "$command" >".venv/bin/$name"
      chmod +x ".venv/bin/$name"
    else
      ln -s "$command" ".venv/bin/$name"
    fi
  done
  # the project's command, as an install would make it (the clone is not installed)
  printf '#!/bin/sh\nexec "%s/.venv/bin/python" -m exporter "$@"\n' "$ROOT" >.venv/bin/queue-exporter
  chmod +x .venv/bin/queue-exporter
  mkdir .venv/tools
  printf '%s\n' "$made_by" >"$marker"
  say ".venv: made, linked to $VENV"
}

link_tool() { # link_tool NAME: .venv/tools/NAME is $VENV (when .venv is this script's)
  [ -e .venv/queue-exporter-cache ] || return 0
  ln -sfn "$VENV" ".venv/tools/$1"
}

project_venv() {
  # The project's venv: pyproject's dev extra (scripts/requirements.py) under constraints/dev.txt.
  local dev_requirements
  mapfile -t dev_requirements < <("$PYTHON" scripts/requirements.py dev)
  cached_venv project constraints/dev.txt "${dev_requirements[@]}"
  link_venv
}

tool_python_version() { # the Python version TOOL_PYTHONS names for a tool venv, or nothing
  local entry name version
  for entry in "${TOOL_PYTHONS[@]}"; do
    read -r name version <<<"$entry"
    [ "$name" != "$1" ] || { echo "$version"; return; }
  done
}

python_venvs() {
  local floors floor_tools entry words python version
  project_venv
  for entry in "${TOOL_VENVS[@]}"; do
    read -r -a words <<<"$entry"
    python=""
    version=$(tool_python_version "${words[0]}")
    if [ -n "$version" ]; then
      python=$(python_of "$version") ||
        die "venv ${words[0]}: no Python $version (apt-get install python$version-venv, or pyenv install $version)"
    fi
    VENV_PYTHON=$python cached_venv "${words[0]}" "constraints/${words[0]}.txt" "${words[@]:1}"
    link_tool "${words[0]}"
  done
  # The lowest version of every dependency pyproject.toml allows (scripts/floors.py): .ci/run
  # runs a smoke subset of the tests there, so a floor that stopped working fails CI. The test
  # tools (pytest and its plugins, Hypothesis and psutil, which tests/ imports) at the
  # project's pins; the floors need no other pin.
  mapfile -t floors < <("$PYTHON" scripts/floors.py)
  local tools='pytest|pytest-timeout|pytest-xdist|execnet|pluggy|iniconfig|hypothesis|attrs|sortedcontainers|psutil'
  mapfile -t floor_tools < <(grep -E -i "^($tools)==" constraints/dev.txt)
  cached_venv floors - "${floors[@]}" "${floor_tools[@]}"
  link_tool floors
}

# --- Node folders: tests/node/<name>/ with a committed package-lock.json, installed by
# `npm ci` once per hash of (node, package.json, package-lock.json); node_modules linked.
link_node_folder() {
  local folder=$1 name key dir
  name=${folder##*/}
  key=$({ node --version; cat "$folder/package.json" "$folder/package-lock.json"; } | sha256sum | cut -c1-16)
  dir=$CACHE/npm/$name-$key
  if [ ! -e "$dir/.complete" ]; then
    mkdir -p "$CACHE/npm"
    (
      flock 9
      [ -e "$dir/.complete" ] && exit 0
      say "npm $name: npm ci in $dir"
      rm -rf "$dir" && mkdir -p "$dir"
      cp "$folder/package.json" "$folder/package-lock.json" "$dir/"
      (cd "$dir" && npm ci --no-audit --no-fund --silent) || die "npm $name: npm ci failed"
      touch "$dir/.complete"
    ) 9>"$dir.lock"
  fi
  local link=$folder/node_modules
  if [ -e "$link" ] && [ "$(readlink "$link")" != "$dir/node_modules" ] &&
    [[ "$(readlink "$link")" != "$CACHE"/* ]]; then
    say "npm $name: $link not made by this script, used as it is"
    return
  fi
  ln -sfn "$dir/node_modules" "$link"
  say "npm $name: $link -> $dir/node_modules"
}

if [ "${1:-}" = --fast ]; then # the fast tier reaches no server (tests/fast_tier.py)
  project_venv
  say "done (--fast: the project's venv only)"
  exit 0
fi
install_debian_tools
start_redis
start_postgres
python_venvs
for lock in tests/node/*/package-lock.json; do
  link_node_folder "${lock%/package-lock.json}"
done
say "done"
