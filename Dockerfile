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
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Every dependency ships as a wheel (psycopg[binary], hiredis), so no compiler is needed.
# The venv is made at its final path: its scripts point at /opt/queue-exporter/bin/python.
# No bytecode yet (the runtime stage compiles what the exporter imports), no test suites
# (tornado's is 2.6 MB; the official image drops the standard library's the same way).
RUN python -m venv /opt/queue-exporter \
    && /opt/queue-exporter/bin/pip install --no-compile '.[otlp]' \
    && /opt/queue-exporter/bin/pip uninstall --yes pip setuptools \
    && find /opt/queue-exporter -depth -type d \( -name test -o -name tests \) -exec rm -rf '{}' +

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
COPY --from=build /opt/queue-exporter /opt/queue-exporter
# Bytecode for what the exporter imports, its own modules and the standard library's alike
# (the official image ships the standard library without any): importing every module of the
# package writes it, here where root may, so start-up compiles nothing (it would take twice
# the CPU without the standard library's, 3.5 times without any). What only a lazy import
# loads (the OTLP exporter's protobuf, 0.07 s of CPU) or nothing does (pydantic.v1, most of
# redis.commands) stays source only: 8 MB less than compiling everything.
RUN /opt/queue-exporter/bin/python -c 'import importlib, pkgutil, exporter; [importlib.import_module(m.name) for m in pkgutil.walk_packages(exporter.__path__, "exporter.") if not m.name.startswith(("exporter.demo", "exporter.__main__"))]'

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
