# syntax=docker/dockerfile:1
# queue-exporter's container image: a virtualenv built in one stage, copied into a slim
# runtime without pip or build tools (one layer: the root filesystem of the stage that trims
# the base), run as a non-root user on a read-only root filesystem.
# Built and run by the tests with podman and buildah: scripts/build-image.sh (docs/deploy.md)
# tags it localhost/queue-exporter:<version>, the Helm chart's default image. With Docker:
#   docker build -t queue-exporter:0.1.0 --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --read-only -p 9839:9839 queue-exporter:0.1.0 serve --redis-url redis://host:6379/0 --preset rq

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# binutils for strip, in this stage only: the runtime stage copies the venv, not this stage.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends binutils
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Every dependency ships as a wheel (psycopg[binary], hiredis), so no compiler is needed.
# The venv is made at its final path: its scripts point at /opt/queue-exporter/bin/python.
# No bytecode yet (the runtime stage compiles what the exporter imports), no test suites
# (tornado's is 2.6 MB; the official image drops the standard library's the same way).
# Extension modules that ship with their symbol tables and debug sections (PyYAML's _yaml,
# hiredis, bcrypt, charset-normalizer, protobuf's upb, tornado's speedups) lose them: only a
# debugger reads them, the dynamic loader reads the dynamic symbols, which stay (3.4 MB).
# Those already stripped (psycopg's, pydantic-core's) are left as built. Type stubs (.pyi) are
# read by type checkers only, never by the import system (0.5 MB).
RUN python -m venv /opt/queue-exporter \
    && /opt/queue-exporter/bin/pip install --no-compile '.[otlp]' \
    && /opt/queue-exporter/bin/pip uninstall --yes pip setuptools \
    && find /opt/queue-exporter -depth -type d \( -name test -o -name tests \) -exec rm -rf '{}' + \
    && find /opt/queue-exporter -type f -name '*.so' -exec sh -c \
       'for so; do if readelf -S "$so" | grep -q "\.symtab"; then strip --strip-unneeded "$so"; fi; done' sh '{}' + \
    && find /opt/queue-exporter -type f -name '*.pyi' -delete

# The runtime's root filesystem, made in a stage of its own and copied whole into the image
# below: what it removes from the base (pip, setuptools and ensurepip's wheels: 13.5 MB on the
# stand-in base) then leaves the image, instead of staying in the base's layer under a whiteout.
FROM ${PYTHON_IMAGE} AS runtime
# The same numeric ids as the Helm chart's securityContext (runAsUser/runAsGroup 65532).
# The base's own pip, setuptools and wheel (python:3.11-slim has them in the interpreter's
# site-packages) and the wheels kept for ensurepip go: the image holds no installer.
RUN groupadd --system --gid 65532 queue-exporter \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin queue-exporter \
    && python -m pip uninstall --yes --no-cache-dir --root-user-action=ignore pip setuptools wheel \
    && find / -xdev -name '*.whl' -type f -delete
# What the exporter never reads, each measured on the stand-in base (docs/deploy.md, "Size"):
# - glibc's gconv modules (8.3 MB): iconv's character set converters. Python's codecs are its
#   own; psycopg decodes each client_encoding with them (libpq converts nothing). What else
#   calls iconv here (apt, gpgv, tar, bash's printf) converts between the C.UTF-8 locale's
#   UTF-8 and ASCII or wchar_t, which glibc has built in.
# - glibc's libmvec (1.0 MB): vector maths for code built with OpenMP SIMD; no program or
#   library in the image links it.
# - dpkg's and debconf's backups of their databases (*-old, 0.9 MB); the databases stay, so
#   dpkg, apt and the scanners that read /var/lib/dpkg see every package.
# - from the standard library, what nothing in the image imports: sqlite3 with SQLite itself
#   (1.6 MB; only its extension module links libsqlite3), distutils and lib2to3 (1.0 MB,
#   build and source-conversion tools, gone from Python 3.12 and 3.13), the help topics
#   (pydoc_data, 0.8 MB: help() then says they are missing), CPython's test extension modules
#   (0.4 MB, for its test suite, which neither base has) and turtle (0.1 MB; it needs tkinter,
#   which neither base has working: on the official one idlelib, tkinter, turtledemo, _tkinter
#   and the idle and 2to3 scripts go too, since the Tk libraries _tkinter links are not
#   installed there).
# - files for tools the image does not have (0.2 MB): bash-completion, lintian, reportbug,
#   doc-base, menu, desktop entries and icons.
RUN stdlib=$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))') \
    && rm -rf /usr/lib/*/gconv /usr/lib/*/libmvec.so.1 /var/cache/debconf/*-old /var/lib/dpkg/*-old \
       /usr/lib/*/libsqlite3.so.* "$stdlib"/sqlite3 "$stdlib"/lib-dynload/_sqlite3.* \
       "$stdlib"/distutils "$stdlib"/_distutils_system_mod.py "$stdlib"/lib2to3 "$stdlib"/pydoc_data \
       "$stdlib"/lib-dynload/_test* "$stdlib"/lib-dynload/_ctypes_test* \
       "$stdlib"/lib-dynload/xxlimited* "$stdlib"/lib-dynload/_xxtestfuzz* \
       "$stdlib"/turtle.py "$stdlib"/idlelib "$stdlib"/tkinter "$stdlib"/turtledemo \
       "$stdlib"/lib-dynload/_tkinter.* /usr/local/bin/idle* /usr/local/bin/2to3* \
       /usr/share/bash-completion /usr/share/lintian /usr/share/bug /usr/share/doc-base \
       /usr/share/menu /usr/share/applications /usr/share/pixmaps \
    && ldconfig
COPY --from=build /opt/queue-exporter /opt/queue-exporter
# Bytecode for what the exporter imports, its own modules and the standard library's alike
# (the official image ships the standard library without any): importing every module of the
# package writes it, here where root may, so start-up compiles nothing (it would take twice
# the CPU without the standard library's, 3.5 times without any). What only a lazy import
# loads (the OTLP exporter's protobuf, 0.07 s of CPU) or nothing does (pydantic.v1, most of
# redis.commands) stays source only: 8 MB less than compiling everything. The ready hooks
# (exporter.hooks.*) import their queue library: they load in a queue app, never here.
RUN /opt/queue-exporter/bin/python -c 'import importlib, pkgutil, exporter; [importlib.import_module(m.name) for m in pkgutil.walk_packages(exporter.__path__, "exporter.") if not m.name.startswith(("exporter.demo", "exporter.__main__", "exporter.hooks."))]'

FROM scratch
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="queue-exporter" \
      org.opencontainers.image.description="Queue metrics sidecar: Redis queue keys, PostgreSQL queue tables and job lifecycle events as Prometheus/OpenTelemetry metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=runtime / /
# The base's environment that the exporter relies on (FROM scratch inherits none of it).
ENV PATH=/opt/queue-exporter/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9839
ENTRYPOINT ["queue-exporter"]
CMD ["serve"]
