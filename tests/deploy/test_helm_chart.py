"""The Helm chart: strict lint, renders of several value sets validated against Kubernetes'
schemas and the Prometheus Operator's required fields, the restricted Pod Security Standard,
checkov's Kubernetes checks, the rendered exporter config passing check-config, and the
chart's copies of rules and dashboards and its values table being current."""

from __future__ import annotations

import base64
import copy
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
import yaml

from exporter.config.settings import SourcesConfig
from tests.conftest import scrape_when
from tests.conftest import value as series_value
from tests.private_postgres import TlsPostgres
from tests.private_redis import PrivateRedis, free_port
from tests.tls_certs import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "queue-exporter"
EXAMPLE = ROOT / "helm" / "examples" / "worker-with-sidecar"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "queues", "jobs"
IN_CI = os.environ.get("CI") == "true"
DIGEST = "sha256:" + "0123456789abcdef" * 4
# Justified in the chart's README ("Security"): both only ask for an image pinned by digest.
CHECKOV_SKIPS = ("CKV_K8S_43", "CKV_K8S_15")


def _require(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(f"{module} not installed (pip install -e '.[chart]')", allow_module_level=True)


helm = _require("helm_python")
kubernetes_validate = _require("kubernetes_validate")


# -- value sets ---------------------------------------------------------------------------------

WORKERS = {"app.kubernetes.io/name": "worker"}


def _everything() -> dict[str, Any]:
    """Every optional object on, every credential given in values, TLS on."""
    config: dict[str, Any] = {"presets": ["rq"], "sources": {"redis": {"url": "redis://r:6379/0"}}}
    if "postgres" in SourcesConfig.model_fields:
        config["sources"]["postgres"] = {"application_name": "queue-exporter"}
    if "events" in SourcesConfig.model_fields:
        config["sources"]["events"] = {"streams": ["jobs:events"]}
    return {
        "config": config,
        "replicaCount": 3,
        "image": {"digest": DIGEST},
        "imagePullSecrets": [{"name": "registry"}],
        "redisAuth": {"password": "redis-secret", "sentinelPassword": "sentinel-secret"},
        "postgresAuth": {"dsn": "postgresql://exporter:pg-secret@db:5432/jobs"},
        "webConfig": {"enabled": True, "tlsSecret": "queue-exporter-tls"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "podMonitor": {"enabled": True, "metricRelabelings": [{"action": "drop", "regex": "x"}]},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "grafanaDashboards": {"enabled": True, "folder": "Queues"},
        "networkPolicy": {
            "enabled": True,
            "ingressFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "egress": [{"ports": [{"port": 6379, "protocol": "TCP"}]}],
        },
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "extraArgs": ["--log-level=debug"],
        "extraVolumes": [{"name": "presets", "configMap": {"name": "team-presets"}}],
        "extraVolumeMounts": [{"name": "presets", "mountPath": "/etc/team", "readOnly": True}],
        "otelResourceAttributes": {"deployment.environment.name": "prod"},
        "redisTLS": {"caSecret": "redis-ca", "clientCertSecret": "redis-client"},
        "postgresTLS": {"caSecret": "pg-ca", "clientCertSecret": "pg-client"},
        "podAnnotations": {"example.com/team": "jobs"},
        "podLabels": {"team": "jobs"},
        "serviceAccount": {"annotations": {"example.com/role": "none"}},
        "service": {"annotations": {"example.com/scrape": "true"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "jobs", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/name": "queue-exporter"}
                            },
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "queue-exporter"}},
            }
        ],
        "priorityClassName": "jobs",
    }


VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "sidecar": {
        "mode": "sidecar",
        "sidecar": {"podSelector": WORKERS},
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "redisAuth": {"existingSecret": "redis"},
    },
    "everything": _everything(),
    "existing-secrets": {
        "redisAuth": {
            "existingSecret": "redis",
            "existingSecretPasswordKey": "pw",
            "existingSecretSentinelPasswordKey": "sentinel-pw",
        },
        "postgresAuth": {"existingSecret": "pg-app", "existingSecretDsnKey": "uri"},
        "webConfig": {"enabled": True, "existingSecret": "web", "existingSecretKey": "web.yml"},
    },
    "several-redis": {
        "config": {
            "presets": ["rq"],
            "sources": {
                "redis": [
                    {"name": "eu", "url": "redis+sentinel://s0:26379,s1:26379/queues/0"},
                    {
                        "name": "us",
                        "url": "redis+cluster://r0:6379,r1:6379",
                        "read_from": "replica",
                    },
                ]
            },
        },
        "redisAuth": {"existingSecret": "redis", "existingSecretSentinelPasswordKey": "sentinels"},
    },
    "existing-secret-sentinel-only": {
        "config": {
            "presets": ["rq"],
            "sources": {"redis": {"url": "redis+sentinel://s0:26379,s1:26379/queues/0"}},
        },
        "redisAuth": {
            "existingSecret": "sentinels",
            "existingSecretPasswordKey": "",
            "existingSecretSentinelPasswordKey": "sentinel-pw",
        },
    },
    "sentinel-only-password": {
        "config": {
            "presets": ["rq"],
            "sources": {"redis": {"url": "redis+sentinel://s0:26379,s1:26379/queues/0"}},
        },
        "redisAuth": {"sentinelPassword": "sentinel-secret"},
    },
    # cert-manager's one Secret (ca.crt, tls.crt, tls.key) for Redis; a CA alone for PostgreSQL
    "backend-tls": {
        "config": {
            "presets": ["rq"],
            "sources": {
                "redis": {"url": "rediss://redis:6380/0"},
                "postgres": {"host": "db", "dbname": "jobs"},
            },
        },
        "redisTLS": {"caSecret": "redis-exporter-cert", "clientCertSecret": "redis-exporter-cert"},
        "postgresTLS": {"caSecret": "pg-ca", "caKey": "root.crt"},
    },
    "tls": {
        "webConfig": {"enabled": True, "tlsSecret": "queue-exporter-tls"},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
    },
}


# -- rendering ----------------------------------------------------------------------------------


def render(values: dict[str, Any], chart: Path = CHART) -> dict[str, str]:
    loaded = helm.Chart.load(str(chart))
    rendered: dict[str, str] = loaded.render(values, name=RELEASE, namespace=NAMESPACE)
    return rendered


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def kind(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == name]


def one(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = kind(docs, name)
    assert len(found) == 1, f"expected one {name}, got {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def renders() -> dict[str, list[dict[str, Any]]]:
    return {name: documents(render(values)) for name, values in VALUE_SETS.items()}


def exporter_pods(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, exporter container) of every workload that runs the exporter."""
    for doc in kind(docs, "Deployment"):
        spec = doc["spec"]["template"]["spec"]
        for container in spec["containers"]:
            if container["name"] == "queue-exporter":
                yield spec, container


# -- lint and schema ----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", ["defaults", "sidecar", "everything"])
def test_strict_lint_is_clean(value_set: str) -> None:
    report = helm.lint(
        str(CHART), VALUE_SETS[value_set], strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"mode": "sidecar"}, "/sidecar/podSelector"),
        ({"mode": "daemonset"}, "/mode"),
        ({"replicas": 2}, "replicas"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"port": 70000}, "/port"),
        ({"redisTLS": {"ca": "x"}}, "/redisTLS"),
        ({"postgresTLS": {"caKey": ""}}, "/postgresTLS/caKey"),
        ({"extraVolumeMounts": [{"name": "x"}]}, "/extraVolumeMounts/0"),
        ({"otelResourceAttributes": {"team": "a,b"}}, "/otelResourceAttributes/team"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        render(values)


def test_probes_can_be_turned_off() -> None:
    docs = documents(render({"readinessProbe": None}))
    ((_, container),) = exporter_pods(docs)
    assert "readinessProbe" not in container and "livenessProbe" in container


# -- Kubernetes schemas -------------------------------------------------------------------------

CRD_GROUP = "monitoring.coreos.com/"


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_validates_strictly(
    renders: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    docs = renders[value_set]
    assert docs
    for doc in docs:
        assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]
        if doc["apiVersion"].startswith(CRD_GROUP):
            continue  # checked against the Prometheus Operator's required fields below
        for version in (KUBE_VERSION, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_objects_of_each_mode(renders: dict[str, list[dict[str, Any]]]) -> None:
    def kinds(value_set: str) -> set[str]:
        return {doc["kind"] for doc in renders[value_set]}

    assert kinds("defaults") == {
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    }
    # Sidecar mode: the workers' chart owns the pods; a NetworkPolicy would select them.
    assert kinds("sidecar") == {"ConfigMap", "Service", "ServiceMonitor", "PodMonitor"}
    assert {"Secret", "PrometheusRule", "ServiceMonitor", "PodMonitor"} <= kinds("everything")
    assert "Secret" not in kinds("existing-secrets")


# -- Pod Security Standard "restricted" ---------------------------------------------------------


def assert_restricted(container: dict[str, Any], pod: dict[str, Any] | None = None) -> None:
    """The restricted profile's rules, for a container whose own securityContext must carry
    them (in sidecar mode the pod-level context is the workers')."""
    context = {**(pod or {}).get("securityContext", {}), **container["securityContext"]}
    own = container["securityContext"]
    assert own["runAsNonRoot"] is True and own.get("runAsUser", 1) != 0
    assert own["allowPrivilegeEscalation"] is False
    assert own.get("privileged") is not True
    assert own["capabilities"]["drop"] == ["ALL"] and not own["capabilities"].get("add")
    assert own["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    assert own["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True
    for volume in (pod or {}).get("volumes", []):
        assert "hostPath" not in volume
    assert not (pod or {}).get("hostNetwork") and not (pod or {}).get("hostPID")
    for port in container.get("ports", []):
        assert "hostPort" not in port


@pytest.mark.parametrize("value_set", ["defaults", "everything", "tls", "existing-secrets"])
def test_deployment_is_restricted(renders: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    ((pod, container),) = exporter_pods(renders[value_set])
    assert_restricted(container, pod)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    assert container["resources"]["limits"] and container["resources"]["requests"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_probes_and_ports(renders: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    for _, container in exporter_pods(renders[value_set]):
        (port,) = container["ports"]
        assert (port["name"], port["containerPort"]) == ("metrics", 9839)
        scheme = "HTTPS" if VALUE_SETS[value_set].get("webConfig", {}).get("enabled") else "HTTP"
        liveness, readiness = container["livenessProbe"], container["readinessProbe"]
        assert liveness["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": scheme}
        assert readiness["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": scheme}


# -- volumes, secrets and the exporter's config -------------------------------------------------


def mounted_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Path inside the container -> 'secret NAME KEY' / 'configMap NAME KEY' / 'dir'."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    files = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]  # every mount has its volume
        source_kind = (
            "secret" if "secret" in volume else "configMap" if "configMap" in volume else ""
        )
        if "projected" in volume:
            files.update(_projected(volume, mount["mountPath"]))
            continue
        if not source_kind:
            files[mount["mountPath"]] = "dir"
            continue
        source = volume[source_kind]
        name = source.get("secretName") or source.get("name")
        for item in source.get("items", []):
            files[f"{mount['mountPath']}/{item['path']}"] = f"{source_kind} {name} {item['key']}"
        files[mount["mountPath"]] = f"{source_kind} {name} *"
    return files


def _projected(volume: dict[str, Any], path: str) -> dict[str, str]:
    """A projected volume's files: path -> 'secret NAME KEY'."""
    files = {}
    for source in volume["projected"]["sources"]:
        secret = source["secret"]
        for item in secret["items"]:
            files[f"{path}/{item['path']}"] = f"secret {secret['name']} {item['key']}"
    return files


def rendered_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    configmap = next(doc for doc in kind(docs, "ConfigMap") if "config.yml" in doc["data"])
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yml"])
    return config


FILE_SETTINGS = ("password_file", "sentinel_password_file", "dsn_file")
FILE_SETTINGS += (
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "sslrootcert",
    "sslcert",
    "sslkey",
)


def configured_files(config: dict[str, Any]) -> list[str]:
    """Every file the exporter's config names in its sources (each Redis of a list too)."""
    sources = config.get("sources", {})
    connections = [sources.get("postgres") or {}, (sources.get("events") or {}).get("redis") or {}]
    redis = sources.get("redis") or {}
    connections += redis if isinstance(redis, list) else [redis]
    return [
        connection[key] for connection in connections for key in FILE_SETTINGS if key in connection
    ]


@pytest.mark.parametrize(
    "value_set", ["defaults", "everything", "existing-secrets", "tls", "backend-tls"]
)
def test_config_files_are_mounted(renders: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    docs = renders[value_set]
    ((pod, container),) = exporter_pods(docs)
    files = mounted_files(pod, container)
    config = rendered_config(docs)
    assert "--config=/etc/queue-exporter/config/config.yml" in container["args"]
    assert files["/etc/queue-exporter/config/config.yml"].startswith("configMap")
    assert files["/tmp"] == "dir"  # the root filesystem is read-only
    paths = [config.get("web_config_file"), *configured_files(config)]
    for path in filter(None, paths):
        assert files[path].startswith("secret "), path
    if VALUE_SETS[value_set].get("webConfig", {}).get("tlsSecret"):
        assert files["/etc/queue-exporter/tls"] == "secret queue-exporter-tls *"


def test_existing_secrets_are_referenced(renders: dict[str, list[dict[str, Any]]]) -> None:
    ((pod, container),) = exporter_pods(renders["existing-secrets"])
    files = mounted_files(pod, container)
    assert files["/etc/queue-exporter/redis/password"] == "secret redis pw"
    assert files["/etc/queue-exporter/redis/sentinel-password"] == "secret redis sentinel-pw"
    assert files["/etc/queue-exporter/postgres/dsn"] == "secret pg-app uri"
    assert files["/etc/queue-exporter/web/web-config.yml"] == "secret web web.yml"


def test_backend_tls_comes_from_its_secrets(renders: dict[str, list[dict[str, Any]]]) -> None:
    docs = renders["backend-tls"]
    ((pod, container),) = exporter_pods(docs)
    files = mounted_files(pod, container)
    assert files["/etc/queue-exporter/redis-tls/ca.crt"] == "secret redis-exporter-cert ca.crt"
    assert files["/etc/queue-exporter/redis-tls/client.crt"] == "secret redis-exporter-cert tls.crt"
    assert files["/etc/queue-exporter/redis-tls/client.key"] == "secret redis-exporter-cert tls.key"
    assert files["/etc/queue-exporter/postgres-tls/ca.crt"] == "secret pg-ca root.crt"
    sources = rendered_config(docs)["sources"]
    assert sources["redis"]["tls_ca_file"] == "/etc/queue-exporter/redis-tls/ca.crt"
    assert sources["redis"]["tls_cert_file"] == "/etc/queue-exporter/redis-tls/client.crt"
    assert sources["redis"]["tls_key_file"] == "/etc/queue-exporter/redis-tls/client.key"
    assert sources["postgres"]["sslrootcert"] == "/etc/queue-exporter/postgres-tls/ca.crt"
    assert sources["postgres"]["sslmode"] == "verify-full"  # a CA that verifies nothing is none
    assert "sslcert" not in sources["postgres"] and "sslkey" not in sources["postgres"]
    # libpq refuses a client key others than the owner's group may read
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    (client,) = volumes["queue-exporter-redis-tls"]["projected"]["sources"][1:]
    assert [item.get("mode") for item in client["secret"]["items"]] == [None, 0o440]


def test_a_configured_sslmode_is_kept() -> None:
    values = copy.deepcopy(VALUE_SETS["backend-tls"])
    values["config"]["sources"]["postgres"]["sslmode"] = "verify-ca"
    assert (
        rendered_config(documents(render(values)))["sources"]["postgres"]["sslmode"] == "verify-ca"
    )


def test_extra_volumes_are_mounted(renders: dict[str, list[dict[str, Any]]]) -> None:
    ((pod, container),) = exporter_pods(renders["everything"])
    assert mounted_files(pod, container)["/etc/team"] == "configMap team-presets *"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {
        variable["name"]: variable.get("value", variable.get("valueFrom"))
        for variable in container["env"]
    }


@pytest.mark.parametrize("value_set", ["defaults", "everything"])
def test_the_otlp_resource_names_the_pod_and_its_namespace(
    renders: dict[str, list[dict[str, Any]]], value_set: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The downward API's pod name and namespace, expanded as Kubernetes expands $(VAR) (from
    variables defined earlier), read by the SDK's own detector."""
    from opentelemetry.sdk.resources import OTELResourceDetector

    ((_, container),) = exporter_pods(renders[value_set])
    env = _env(container)
    names = [variable["name"] for variable in container["env"]]
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert names.index("OTEL_RESOURCE_ATTRIBUTES") > names.index("POD_NAMESPACE")
    pod = {"POD_NAME": "queues-queue-exporter-7d9f-x2x", "POD_NAMESPACE": NAMESPACE}
    expanded = re.sub(r"\$\((\w+)\)", lambda m: pod[m[1]], env["OTEL_RESOURCE_ATTRIBUTES"])
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", expanded)
    attributes = OTELResourceDetector().detect().attributes
    assert attributes["k8s.pod.name"] == pod["POD_NAME"]
    assert attributes["k8s.namespace.name"] == NAMESPACE
    extra = VALUE_SETS[value_set].get("otelResourceAttributes", {})
    assert {key: attributes[key] for key in extra} == extra


def _lay_out_mounted_files(
    pod: dict[str, Any], container: dict[str, Any], secrets: dict[str, dict[str, Path]], root: Path
) -> None:
    """The pod's files from Secrets, copied under `root` where the container would see them."""
    for path, description in mounted_files(pod, container).items():
        if description.startswith("secret ") and not description.endswith(" *"):
            _, name, key = description.split()
            file = root / path.removeprefix("/")
            file.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(secrets[name][key], file)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[PrivateRedis, Pki]]:
    """A redis-server of the test's own whose TLS port asks for a client certificate."""
    pki = make_pki(tmp_path / "pki")
    server = PrivateRedis(
        tmp_path,
        *("--tls-port", str(free_port())),
        *("--tls-cert-file", str(pki.path("server.crt"))),
        *("--tls-key-file", str(pki.path("server.key"))),
        *("--tls-ca-cert-file", str(pki.path("ca.crt")), "--tls-auth-clients", "yes"),
    )
    yield server.start(), pki
    server.stop()


def test_the_chart_tls_paths_reach_a_tls_redis(
    tls_redis: tuple[PrivateRedis, Pki], tmp_path: Path, run_exporter: Any
) -> None:
    """The rendered config, with the files the rendered volumes mount from cert-manager's
    Secret, opens rediss:// to a server that verifies the client certificate."""
    server, pki = tls_redis
    tls_port = int(server.extra_args[server.extra_args.index("--tls-port") + 1])
    values = {"redisTLS": VALUE_SETS["backend-tls"]["redisTLS"]}
    values["config"] = {
        "presets": ["orchestrata"],
        "sources": {"redis": {"url": f"rediss://127.0.0.1:{tls_port}/0"}},
    }
    docs = documents(render(values))
    ((pod, container),) = exporter_pods(docs)
    certificate = {"ca.crt": "ca.crt", "tls.crt": "client.crt", "tls.key": "client.key"}
    secrets = {"redis-exporter-cert": {key: pki.path(file) for key, file in certificate.items()}}
    root = tmp_path / "pod"
    _lay_out_mounted_files(pod, container, secrets, root)
    config = rendered_config(docs)
    redis_source = config["sources"]["redis"]
    for setting in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        redis_source[setting] = str(root / redis_source[setting].removeprefix("/"))
    with redis.Redis(
        host="127.0.0.1",
        port=tls_port,
        ssl=True,
        ssl_ca_certs=str(pki.path("ca.crt")),
        ssl_certfile=str(pki.path("client.crt")),
        ssl_keyfile=str(pki.path("client.key")),
    ) as client:
        client.rpush("orchestrata:dlq:billing", "{}", "{}", "{}")
        expected = client.llen("orchestrata:dlq:billing")
    config["listen_address"] = "127.0.0.1:0"
    app = run_exporter(config)
    series = scrape_when(app, "queue_depth", queue="billing", state="dead_letter")
    assert series_value(series, "queue_depth", queue="billing", state="dead_letter") == expected


@pytest.fixture
def tls_postgres(tmp_path: Path) -> Iterator[tuple[TlsPostgres, Pki]]:
    pki = make_pki(tmp_path / "pki")
    server = TlsPostgres(pki)
    try:
        yield server.start(), pki
    finally:
        server.stop()


def test_the_chart_tls_paths_reach_a_tls_postgres(
    tls_postgres: tuple[TlsPostgres, Pki], tmp_path: Path, run_exporter: Any
) -> None:
    """The same for PostgreSQL: libpq, given the rendered sslrootcert, sslcert, sslkey and
    sslmode, verifies the server and shows the client certificate the server asks for."""
    server, pki = tls_postgres
    values = {
        "config": {
            "sources": {
                "postgres": {
                    "host": "127.0.0.1",
                    "port": server.port,
                    "user": "postgres",
                    "dbname": "postgres",
                    "collectors": [
                        {
                            "name": "tls_probe",
                            "query": "SELECT ssl::int AS ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                            "values": [{"column": "ssl", "metric": "tls_probe_ssl"}],
                        }
                    ],
                }
            }
        },
        "postgresTLS": {"caSecret": "pg-client", "clientCertSecret": "pg-client"},
    }
    docs = documents(render(values))
    ((pod, container),) = exporter_pods(docs)
    certificate = {"ca.crt": "ca.crt", "tls.crt": "client.crt", "tls.key": "client.key"}
    secrets = {"pg-client": {key: pki.path(file) for key, file in certificate.items()}}
    root = tmp_path / "pod"
    _lay_out_mounted_files(pod, container, secrets, root)
    config = rendered_config(docs)
    postgres = config["sources"]["postgres"]
    assert postgres["sslmode"] == "verify-full"
    for setting in ("sslrootcert", "sslcert", "sslkey"):
        postgres[setting] = str(root / postgres[setting].removeprefix("/"))
    # In the pod the key is root's, 0440, read by the exporter's group: libpq allows that. Here
    # the test's own user owns the copy, and libpq then wants it private to that user.
    Path(postgres["sslkey"]).chmod(0o600)
    config["listen_address"] = "127.0.0.1:0"
    app = run_exporter(config)
    series = scrape_when(app, "tls_probe_ssl")
    assert series_value(series, "tls_probe_ssl") == 1


def test_secrets_stay_out_of_the_configmap(renders: dict[str, list[dict[str, Any]]]) -> None:
    docs = renders["everything"]
    for configmap in kind(docs, "ConfigMap"):
        text = json.dumps(configmap)
        assert "redis-secret" not in text and "pg-secret" not in text
        assert "sentinel-secret" not in text
    secrets = {doc["metadata"]["name"]: doc for doc in kind(docs, "Secret")}
    ((pod, container),) = exporter_pods(docs)
    for description in mounted_files(pod, container).values():
        if description.startswith("secret ") and not description.endswith("*"):
            _, name, key = description.split()
            if name in secrets:  # created by the chart: the mounted key exists
                assert key in secrets[name]["data"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rendered_config_passes_check_config(
    renders: dict[str, list[dict[str, Any]]], value_set: str, tmp_path: Path
) -> None:
    """The ConfigMap's config, with the mounted files laid out under tmp_path as the pod
    would see them, is accepted by `queue-exporter check-config`."""
    docs = renders[value_set]
    text = next(doc for doc in kind(docs, "ConfigMap") if "config.yml" in doc["data"])["data"][
        "config.yml"
    ]
    root = tmp_path / "etc" / "queue-exporter"
    for name in ("redis/password", "redis/sentinel-password", "postgres/dsn"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("postgresql://u:p@db/jobs" if "dsn" in name else "pw")
    for path in configured_files(yaml.safe_load(text)):  # the TLS files: present, as mounted
        file = root / path.removeprefix("/etc/queue-exporter/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch()
    (root / "web").mkdir()
    (root / "web" / "web-config.yml").write_text(
        yaml.safe_dump(VALUE_SETS[value_set].get("webConfig", {}).get("config", {}))
    )
    config_file = tmp_path / "config.yml"
    config_file.write_text(text.replace("/etc/queue-exporter/", f"{root}/"))
    command = [
        str(Path(sys.executable).parent / "queue-exporter"),
        "check-config",
        str(config_file),
        "--show-config",
    ]
    if not yaml.safe_load(text).get("presets"):  # the operator names the layout, or none starts
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1
        assert "nothing to sample or consume" in refused.stderr
        command += ["--preset", "rq"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "listen_address: 0.0.0.0:9839" in result.stdout
    assert "redis-secret" not in result.stdout and "pg-secret" not in result.stdout
    assert "sentinel-secret" not in result.stdout


# -- Prometheus Operator objects ----------------------------------------------------------------

_DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")
_RELABEL_ACTIONS = {"replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep", "hashmod"}
_RELABEL_ACTIONS |= {"lowercase", "uppercase", "keepequal", "dropequal"}
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def assert_endpoint(endpoint: dict[str, Any], port_names: set[str]) -> None:
    assert endpoint["port"] in port_names
    assert endpoint["path"] == "/metrics"
    assert endpoint.get("scheme", "http") in ("http", "https")
    for key in ("interval", "scrapeTimeout"):
        assert _DURATION.match(endpoint[key]), endpoint[key]
    for relabeling in endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", []):
        assert relabeling.get("action", "replace") in _RELABEL_ACTIONS
    job = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert job == [{"action": "replace", "targetLabel": "job", "replacement": "queue-exporter"}]


def assert_monitor_metadata(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert _DNS1123.match(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 253
    assert all(isinstance(value, str) for value in doc["metadata"]["labels"].values())


@pytest.mark.parametrize("value_set", ["everything", "sidecar", "tls"])
def test_service_monitor(renders: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    docs = renders[value_set]
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert_monitor_metadata(monitor)
    spec = monitor["spec"]
    # Required by the CRD: selector; the endpoints must name a port of the selected Service.
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert_endpoint(endpoint, {port["name"] for port in service["spec"]["ports"]})
    tls = "webConfig" in VALUE_SETS[value_set]
    assert endpoint.get("scheme") == ("https" if tls else None)
    assert ("tlsConfig" in endpoint) == tls


@pytest.mark.parametrize("value_set", ["everything", "sidecar", "tls"])
def test_pod_monitor(renders: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    docs = renders[value_set]
    monitor = one(docs, "PodMonitor")
    assert_monitor_metadata(monitor)
    spec = monitor["spec"]
    selector = spec["selector"]["matchLabels"]
    pods = list(exporter_pods(docs))
    if pods:  # deployment mode: it selects the exporter's pods
        ((_, container),) = pods
        deployment = one(docs, "Deployment")
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        ports = {port["name"] for port in container["ports"]}
    else:  # sidecar mode: the worker pods
        assert selector == WORKERS
        ports = {"metrics"}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert_endpoint(endpoint, ports)


def rule_groups(job: str) -> list[dict[str, Any]]:
    """The groups `python -m alerts --job JOB --output FILE` writes for a plain Prometheus."""
    from alerts.config import DEFAULTS, with_settings
    from alerts.generate import rules_document

    groups: list[dict[str, Any]] = rules_document(with_settings(DEFAULTS, {"job": job}))["groups"]
    return groups


def test_prometheus_rule_equals_alerts(renders: dict[str, list[dict[str, Any]]]) -> None:
    """The chart's defaults give the shipped rules, byte for byte what a plain Prometheus
    loads (its job, metricsJob, is the shipped rules' queue-exporter)."""
    rule = one(renders["everything"], "PrometheusRule")
    assert_monitor_metadata(rule)
    groups = rule["spec"]["groups"]
    shipped = yaml.safe_load((ROOT / "alerts" / "queue-exporter.rules.yml").read_text())
    assert groups == shipped["groups"]
    assert groups == rule_groups(yaml.safe_load((CHART / "values.yaml").read_text())["metricsJob"])
    for group in groups:  # what the CRD requires of each group and rule
        assert isinstance(group["name"], str) and group["name"]
        for item in group["rules"]:
            assert isinstance(item["expr"], str | int)
            assert ("alert" in item) != ("record" in item)
            assert _DURATION.match(item.get("for", "0"))
            for key in ("labels", "annotations"):
                assert all(isinstance(value, str) for value in item.get(key, {}).values())


def test_prometheus_rule_selects_the_job_it_is_given() -> None:
    values = {"metricsJob": "queues", "prometheusRule": {"enabled": True}}
    assert one(documents(render(values)), "PrometheusRule")["spec"]["groups"] == rule_groups(
        "queues"
    )
    values["prometheusRule"]["job"] = "federated-queues"
    assert one(documents(render(values)), "PrometheusRule")["spec"]["groups"] == rule_groups(
        "federated-queues"
    )


def test_prometheus_rule_takes_job_runbook_and_thresholds_from_values(tmp_path: Path) -> None:
    """alerts/tests/fitted/settings.yml given as the chart's values: promtool's tests of those
    settings pass on the rendered rules, as on `python -m alerts --values`'s."""
    from tests.deploy.test_alerts import FITTED, fitted_rules_pass_promtool

    settings = yaml.safe_load((FITTED / "settings.yml").read_text())
    values = {
        "prometheusRule": {
            "enabled": True,
            "job": settings.pop("job"),
            "runbookUrlBase": settings.pop("runbook_url_base"),
            "thresholds": settings,
        }
    }
    rule = one(documents(render(values)), "PrometheusRule")
    rules_text = yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False)
    assert "__qe_" not in rules_text  # every token replaced
    fitted_rules_pass_promtool(rules_text, tmp_path)


def test_values_hold_every_threshold_at_its_default() -> None:
    from alerts.config import DEFAULTS, THRESHOLDS

    chart = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]
    assert chart["thresholds"] == {name: getattr(DEFAULTS, name) for name in THRESHOLDS}
    assert chart["runbookUrlBase"] == DEFAULTS.runbook_url_base


def test_dashboard_configmaps_equal_dashboards(renders: dict[str, list[dict[str, Any]]]) -> None:
    docs = renders["everything"]
    shipped = {
        Path(path).name: json.loads(Path(path).read_text())
        for path in glob.glob(str(ROOT / "dashboards" / "*.json"))
    }
    configmaps = [doc for doc in kind(docs, "ConfigMap") if "config.yml" not in doc["data"]]
    rendered = {}
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "Queues"}
        ((name, text),) = configmap["data"].items()
        rendered[name] = json.loads(text)
    assert rendered == shipped
    for doc in renders["defaults"]:
        assert "grafana_dashboard" not in doc["metadata"]["labels"]


# -- the chart's copies and docs ----------------------------------------------------------------


def test_chart_copies_of_rules_and_dashboards_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_chart_files.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for path in glob.glob(str(ROOT / "dashboards" / "*.json")):
        copy = CHART / "files" / "dashboards" / Path(path).name
        assert copy.read_bytes() == Path(path).read_bytes()


def test_sync_script_copies_and_prunes(tmp_path: Path) -> None:
    """Run the sync script on a copy of the tree, with one dashboard added and one removed."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "sync_chart_files.py", tree / "scripts")
    (tree / "dashboards").mkdir()
    (tree / "dashboards" / "extra.json").write_text("{}\n")
    stale = tree / "helm" / "queue-exporter" / "files" / "dashboards" / "gone.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}\n")
    script = [sys.executable, str(tree / "scripts" / "sync_chart_files.py")]
    check = subprocess.run([*script, "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1
    assert "missing: helm/queue-exporter/files/dashboards/extra.json" in check.stderr
    assert "left over: helm/queue-exporter/files/dashboards/gone.json" in check.stderr
    subprocess.run(script, check=True, capture_output=True, timeout=60)
    assert not stale.exists()
    assert (stale.parent / "extra.json").read_text() == "{}\n"
    assert subprocess.run([*script, "--check"], timeout=60).returncode == 0


def test_values_table_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_values_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_every_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], values: dict[str, Any], prefix: str) -> None:
        for key, value in values.items():
            assert key in node.get("properties", {}), f"{prefix}{key} is not in the schema"
            child = node["properties"][key]
            if "properties" in child and isinstance(value, dict):
                walk(child, value, f"{prefix}{key}.")

    walk(schema, defaults, "")
    helm.Chart.load(str(CHART)).validate_schema({})


def test_readme_justifies_every_skipped_check() -> None:
    readme = (CHART / "README.md").read_text()
    for check in CHECKOV_SKIPS:
        assert f"`{check}`" in readme


# -- checkov ------------------------------------------------------------------------------------


def checkov_binary() -> str:
    local = ROOT / ".venv" / "tools" / "checkov" / "bin" / "checkov"
    found = str(local) if local.exists() else shutil.which("checkov")
    if found is None:
        if IN_CI:
            pytest.fail("checkov is not installed (scripts/setup.sh installs it)")
        pytest.skip("checkov is not installed (scripts/setup.sh installs it)")
    return found


def run_checkov(values: dict[str, Any], directory: Path, skips: tuple[str, ...]) -> dict[str, Any]:
    directory.mkdir()
    for path, text in render(values).items():
        if path.endswith(".yaml") and text.strip():
            (directory / Path(path).name).write_text(text)
    command = [checkov_binary(), "-d", str(directory), "--framework", "kubernetes"]
    command += ["--skip-download", "--output", "json", "--quiet"]
    if skips:
        command += ["--skip-check", ",".join(skips)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.stdout.strip(), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def failed_checks(report: dict[str, Any]) -> list[str]:
    failed = report.get("results", {}).get("failed_checks", [])
    return [f"{check['check_id']} {check['resource']}" for check in failed]


@pytest.mark.parametrize("value_set", ["defaults", "backend-tls"])
def test_checkov_passes_on_the_render(tmp_path: Path, value_set: str) -> None:
    report = run_checkov(VALUE_SETS[value_set], tmp_path / "render", CHECKOV_SKIPS)
    assert failed_checks(report) == []
    assert report["summary"]["passed"] > 50


def test_checkov_passes_without_skips_once_pinned_by_digest(tmp_path: Path) -> None:
    report = run_checkov({"image": {"digest": DIGEST}}, tmp_path / "render", ())
    assert failed_checks(report) == []


# -- the sidecar example: a workers' chart with this chart as a dependency ----------------------


@pytest.fixture(scope="module")
def example_docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    chart = tmp_path_factory.mktemp("example") / "worker-with-sidecar"
    shutil.copytree(EXAMPLE, chart)
    shutil.copytree(CHART, chart / "charts" / "queue-exporter")  # what `helm dependency build` does
    return documents(render({}, chart))


def test_sidecar_example_renders_a_valid_worker(example_docs: list[dict[str, Any]]) -> None:
    for doc in example_docs:
        if not doc["apiVersion"].startswith(CRD_GROUP):
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    worker = one(example_docs, "Deployment")
    assert worker["metadata"]["name"] == f"{RELEASE}-worker"
    pod = worker["spec"]["template"]["spec"]
    names = [container["name"] for container in pod["containers"]]
    assert names == ["worker", "queue-exporter"]
    exporter = pod["containers"][1]
    assert_restricted(exporter)
    files = mounted_files(pod, exporter)
    assert files["/etc/queue-exporter/redis/password"] == "secret redis redis-password"
    # The pod selector the Service and PodMonitor use matches the worker pods' labels.
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert one(example_docs, "Service")["spec"]["selector"].items() <= labels.items()
    assert one(example_docs, "PodMonitor")["spec"]["selector"]["matchLabels"] == labels
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/queue-exporter-config"])
    configmap = one(example_docs, "ConfigMap")
    assert configmap["metadata"]["name"] == pod["volumes"][0]["configMap"]["name"]
    config = yaml.safe_load(configmap["data"]["config.yml"])
    assert config["presets"] == ["rq"]


def test_sidecar_mode_prints_the_container_in_its_notes() -> None:
    notes = render(VALUE_SETS["sidecar"])["queue-exporter/templates/NOTES.txt"]
    pasted = yaml.safe_load(notes[notes.index("\ncontainers:\n") :])  # the by-hand part
    assert pasted["containers"][0]["name"] == "queue-exporter"
    assert {volume["name"] for volume in pasted["volumes"]} >= {"queue-exporter-config"}


def test_replicas_share_no_state_that_breaks() -> None:
    """Several replicas: one consumer name per pod, and the PDB still lets a node drain."""
    docs = documents(render({"replicaCount": 3}))
    ((pod, container),) = exporter_pods(docs)
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    assert copy.deepcopy(pod)["automountServiceAccountToken"] is False


def test_several_exporters_sample_on_an_elected_one(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    assert "leader_election" not in rendered_config(renders["defaults"])
    assert rendered_config(renders["sidecar"])["leader_election"] == {"enabled": True}
    scaled = documents(render({"replicaCount": 3}))
    assert rendered_config(scaled)["leader_election"] == {"enabled": True}
    opted_out = documents(
        render({"replicaCount": 3, "config": {"leader_election": {"enabled": False}}})
    )
    assert rendered_config(opted_out)["leader_election"] == {"enabled": False}


def test_several_redis_each_get_the_mounted_password(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    docs = renders["several-redis"]
    ((pod, container),) = exporter_pods(docs)
    files = mounted_files(pod, container)
    redis_sources = rendered_config(docs)["sources"]["redis"]
    assert [source["name"] for source in redis_sources] == ["eu", "us"]
    for source in redis_sources:
        assert files[source["password_file"]] == "secret redis redis-password"
        assert files[source["sentinel_password_file"]] == "secret redis sentinels"
    assert redis_sources[1]["url"].startswith("redis+cluster://")


def test_sentinel_password_alone_gets_a_secret_of_its_own(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """The Sentinels may need a password when the master needs none: only that key is
    created, mounted and named in the config."""
    docs = renders["sentinel-only-password"]
    ((pod, container),) = exporter_pods(docs)
    files = mounted_files(pod, container)
    (secret,) = kind(docs, "Secret")
    assert set(secret["data"]) == {"sentinel-password"}
    assert base64.b64decode(secret["data"]["sentinel-password"]) == b"sentinel-secret"
    name = secret["metadata"]["name"]
    assert (
        files["/etc/queue-exporter/redis/sentinel-password"] == f"secret {name} sentinel-password"
    )
    assert "/etc/queue-exporter/redis/password" not in files
    source = rendered_config(docs)["sources"]["redis"]
    assert source["sentinel_password_file"] == "/etc/queue-exporter/redis/sentinel-password"
    assert "password_file" not in source


@pytest.mark.parametrize(
    ("password_key", "sentinel_key"),
    [("pw", ""), ("", "sentinel-pw"), ("pw", "sentinel-pw")],
    ids=["password-only", "sentinel-password-only", "both"],
)
def test_an_existing_secret_mounts_the_keys_it_names(password_key: str, sentinel_key: str) -> None:
    """Each key of redisAuth.existingSecret is optional: a Secret holding the Sentinels'
    password alone mounts that file only, and the config names only the files mounted."""
    values = copy.deepcopy(VALUE_SETS["existing-secret-sentinel-only"])
    values["redisAuth"].update(
        existingSecretPasswordKey=password_key, existingSecretSentinelPasswordKey=sentinel_key
    )
    docs = documents(render(values))
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert kind(docs, "Secret") == []  # the existing one is used, none is created
    ((pod, container),) = exporter_pods(docs)
    files = mounted_files(pod, container)
    source = rendered_config(docs)["sources"]["redis"]
    for key, config_key, path in (
        (password_key, "password_file", "/etc/queue-exporter/redis/password"),
        (sentinel_key, "sentinel_password_file", "/etc/queue-exporter/redis/sentinel-password"),
    ):
        if key:
            assert files[path] == f"secret sentinels {key}"
            assert source[config_key] == path
        else:
            assert path not in files
            assert config_key not in source


def test_an_existing_secret_with_no_key_named_is_refused() -> None:
    values = {
        "redisAuth": {
            "existingSecret": "redis",
            "existingSecretPasswordKey": "",
            "existingSecretSentinelPasswordKey": "",
        }
    }
    with pytest.raises(
        helm.HelmRenderError, match=re.escape("redisAuth.existingSecret is set but names no key")
    ):
        render(values)
