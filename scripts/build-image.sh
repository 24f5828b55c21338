#!/usr/bin/env bash
# Builds the container image from the Dockerfile as committed, with buildah (no Docker daemon),
# into podman's storage as localhost/queue-exporter:<version> and :latest, and prints its size.
#
# The base (the Dockerfile's PYTHON_IMAGE) is $PYTHON_IMAGE when set, else
# python:3.11-slim-bookworm when it is here or can be pulled, else the stand-in that
# scripts/build-image-base.sh makes with debootstrap (cached in podman's storage).
# The OCI labels come from git: the last commit that changed what the build reads (with
# "-dirty" when the work tree changed it since) and that commit's date, so they only change
# when the image does. The build is skipped when the image already holds these inputs (the
# Dockerfile, the build context, the base image, the labels): its label
# queue-exporter.build.inputs carries their hash.
#
# Environment: PYTHON_IMAGE, STORAGE_DRIVER (default vfs: runs without overlay support).
set -euo pipefail
cd "$(dirname "$0")/.."

STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
OFFICIAL_BASE=docker.io/library/python:3.11-slim-bookworm
REPOSITORY=localhost/queue-exporter
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt # Debian's, read by Debian's pip too
# What the build reads: the Dockerfile and the context .dockerignore lets through.
INPUTS=(Dockerfile .dockerignore pyproject.toml README.md exporter)
podman() { command podman --storage-driver "$STORAGE_DRIVER" "$@"; }

for tool in podman buildah; do
  command -v "$tool" >/dev/null || {
    echo "build-image: $tool is missing (scripts/setup.sh installs it)" >&2
    exit 1
  }
done

# One build at a time on this machine: a second one waits, then finds the image built.
lock_dir=${QE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queue-exporter} # setup.sh's cache too
mkdir -p "$lock_dir"
exec 9>"$lock_dir/build-image.lock"
flock 9

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' exporter/__init__.py)
[ -n "$version" ] || {
  echo "build-image: no __version__ in exporter/__init__.py" >&2
  exit 1
}

if [ -n "${PYTHON_IMAGE:-}" ]; then
  base=$PYTHON_IMAGE
elif podman image exists "$OFFICIAL_BASE" ||
  timeout 120 podman --storage-driver "$STORAGE_DRIVER" pull --quiet "$OFFICIAL_BASE" >/dev/null 2>&1; then
  base=$OFFICIAL_BASE
else
  echo "build-image: $OFFICIAL_BASE cannot be pulled: a stand-in made with debootstrap" >&2
  base=$(bash scripts/build-image-base.sh)
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base")

revision=unknown
created=unknown
if git rev-parse --git-dir >/dev/null 2>&1; then
  revision=$(git log -1 --format=%H -- "${INPUTS[@]}")
  created=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd -- "${INPUTS[@]}")
  if [ -n "$(git status --porcelain -- "${INPUTS[@]}")" ]; then revision=$revision-dirty; fi
fi

inputs=$(
  {
    find "${INPUTS[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
      sort -z | xargs -0 sha256sum
    echo "$base_id $version $revision $created"
  } | sha256sum | cut -c1-64
)

image=$REPOSITORY:$version
built=$(podman image inspect --format '{{index .Labels "queue-exporter.build.inputs"}}' "$image" \
  2>/dev/null || true)
if [ "$built" = "$inputs" ]; then
  echo "build-image: $image is up to date (inputs $(echo "$inputs" | cut -c1-12))" >&2
else
  previous=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  echo "build-image: building $image on $base" >&2
  start=$(date +%s)
  # The RUN steps trust what this machine trusts (a TLS-intercepting proxy's CA on the way to
  # PyPI): its CA bundle is mounted over the base's while they run, and is not in the image.
  trust=()
  if [ -f "$CA_BUNDLE" ]; then trust=(--volume "$CA_BUNDLE:$CA_BUNDLE:ro"); fi
  buildah --storage-driver "$STORAGE_DRIVER" bud --isolation chroot --network host "${trust[@]}" \
    --build-arg PYTHON_IMAGE="$base" --build-arg VERSION="$version" \
    --build-arg REVISION="$revision" --build-arg CREATED="$created" \
    --label queue-exporter.build.inputs="$inputs" \
    --tag "$image" --quiet --file Dockerfile . >/dev/null
  echo "build-image: built in $(($(date +%s) - start)) s" >&2
  podman tag "$image" "$REPOSITORY:latest"
  # The image this one replaces, once nothing names it (vfs keeps full copies of layers).
  if [ -n "$previous" ] && [ -z "$(podman image inspect --format '{{.RepoTags}}' "$previous" |
    tr -d '[]')" ]; then
    podman rmi "$previous" >/dev/null || echo "build-image: $previous is still in use" >&2
  fi
fi
podman tag "$image" "$REPOSITORY:latest"
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "$image $((size / 1000000)) MB"
