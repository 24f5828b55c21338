#!/usr/bin/env bash
# A stand-in for python:3.11-slim-bookworm, for machines that cannot pull it: Debian bookworm
# made with debootstrap (Python 3.11 with venv, `python` on PATH), laid out like the official
# image where the Dockerfile or the image's size can tell the difference: pip and setuptools
# installed in the interpreter's own site-packages without bytecode, no EXTERNALLY-MANAGED
# marker, no bytecode or test suite in the standard library (the official build deletes both),
# no docs, man pages, locales or apt lists. Imported into podman's storage and cached there:
# the tag carries a hash of this script and of the Debian mirror, so the base is made again
# only when what makes it changed. Prints the image reference. Needs root (debootstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
PACKAGES=python3,python3-venv,python-is-python3
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
podman() { command podman --storage-driver "$STORAGE_DRIVER" "$@"; }

# The mirror this machine's apt uses for the suite; Debian's default when apt knows none.
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
  awk -v suite="$SUITE" '$2 == suite { print $1; exit }')
mirror=${mirror:-http://deb.debian.org/debian/}

key=$( (cat "$0" && echo "$mirror") | sha256sum | cut -c1-12)
repository=localhost/python-standin
image=$repository:3.11-slim-$SUITE-$key
if podman image exists "$image"; then
  echo "$image"
  exit 0
fi

for tool in debootstrap chroot podman; do
  command -v "$tool" >/dev/null || {
    echo "build-image-base: $tool is missing (scripts/setup.sh installs it)" >&2
    exit 1
  }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
echo "build-image-base: debootstrap $SUITE from $mirror (once per change of this script)" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" >"$work/log" 2>&1 ||
  {
    tail -20 "$work/log" >&2
    exit 1
  }

# python:3.11-slim has pip and setuptools in the interpreter's site-packages (installed with
# --no-compile) and no EXTERNALLY-MANAGED marker: the same here, from the wheels Debian ships
# for venv.
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot "$rootfs" sh -c 'set -- /usr/share/python-wheels/pip-*.whl && python3 "$1/pip" install \
  --quiet --root-user-action=ignore --no-compile --no-index --no-cache-dir --find-links /usr/share/python-wheels pip setuptools'
# The official build's `find /usr/local -depth ( -type d -a ( -name test -o -name tests -o
# -name idle_test ) ) -o ( -type f -a ( -name '*.pyc' -o -name '*.pyo' ) ) -exec rm -rf`, on
# Debian's paths (Debian compiles the standard library when it installs it: 12 MB).
stdlib=()
for dir in "$rootfs"/usr/lib/python3* "$rootfs"/usr/local/lib/python3*; do
  if [ -d "$dir" ]; then stdlib+=("$dir"); fi
done
find "${stdlib[@]}" -depth \( \( -type d -a \( -name test -o -name tests -o -name idle_test \) \) \
  -o \( -type f -a \( -name '*.pyc' -o -name '*.pyo' \) \) \) -exec rm -rf '{}' +
find "${stdlib[@]}" -depth -type d -name __pycache__ -empty -delete
# What the slim images leave out (/dev too: the runtime makes its own).
rm -rf "$rootfs"/dev/* "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/usr/share/locale/* "$rootfs"/root/.cache

tar --numeric-owner -C "$rootfs" -c . |
  podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$image" >/dev/null
# Stand-ins made by earlier versions of this script are no longer used.
podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$repository" |
  while read -r old; do
    # One an image still stands on (a build of another work tree) stays until a later run.
    if [ "$old" != "$image" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  done
echo "$image"
