"""The container image, built from the Dockerfile as committed (scripts/build-image.sh, with
buildah into podman's storage) and run as the Helm chart runs it: the chart's rendered pod
(securityContext, volumes, args, resources) becomes the `podman run` flags, against the real
local Redis and PostgreSQL. Its contents and size are read from the image itself."""

from __future__ import annotations

import base64
import json
import re
import stat
import subprocess
import tarfile
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rq
import yaml

from exporter import __version__
from tests.attune_db import Attune
from tests.conftest import REDIS_HOST, REDIS_PORT, parse_exposition, scrape, total, wait_for
from tests.deploy.test_helm_chart import documents, exporter_pods, kind, one, render
from tests.private_redis import free_port
from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
# Fails the test past it: issue 29's target. The image measured 143.7 MB on the debootstrap
# stand-in for python:3.11-slim-bookworm (docs/deploy.md, "Size"): 6.3 MB of margin.
SIZE_BOUND_MB = 150
BUILD_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "exporter")
# This machine refuses podman's default ulimits; the same on every run, nothing of the chart's.
HOST_LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000")
STOP_BOUND = 5.0  # seconds from SIGTERM to exit: the bound the image promises (issue 29)

pytestmark = pytest.mark.timeout(1800)  # a cold build makes the base with debootstrap first


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        [require("podman"), "--storage-driver", "vfs", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class Built:
    reference: str  # localhost/queue-exporter:<version>
    # The image the reference named once built: what the tests run and read (a build from
    # another work tree on this machine may move the tag meanwhile).
    id: str


@pytest.fixture(scope="module")
def image() -> Built:
    """scripts/build-image.sh's image (built, or found up to date)."""
    require("podman")
    require("buildah")
    done = subprocess.run(
        ["bash", "scripts/build-image.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reference, size, unit = done.stdout.splitlines()[-1].split()
    assert unit == "MB" and int(size) > 0
    assert reference == f"localhost/queue-exporter:{__version__}"
    return Built(reference, inspect(reference)["Id"])


def inspect(image: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(podman("image", "inspect", image))
    return found[0]


# -- what the chart runs ------------------------------------------------------------------------


def chart_pod(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """(pod spec, exporter container, rendered documents) of the chart's Deployment."""
    docs = documents(render(values))
    ((pod, container),) = list(exporter_pods(docs))
    return pod, container, docs


def security_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """The container's effective securityContext as podman flags; a setting this does not
    translate fails the test rather than being left out."""
    context = {**pod.get("securityContext", {}), **container["securityContext"]}
    flags = ["--user", f"{context.pop('runAsUser')}:{context.pop('runAsGroup')}"]
    assert context.pop("runAsNonRoot") is True
    if context.pop("readOnlyRootFilesystem"):
        # Kubernetes adds no tmpfs of its own: only the pod's emptyDirs are writable.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if not context.pop("allowPrivilegeEscalation"):
        flags += ["--security-opt", "no-new-privileges"]
    assert context.pop("privileged") is False
    capabilities = context.pop("capabilities")
    flags += [f"--cap-drop={name.lower()}" for name in capabilities.pop("drop", [])]
    flags += [f"--cap-add={name.lower()}" for name in capabilities.pop("add", [])]
    assert not capabilities, capabilities
    assert context.pop("seccompProfile") == {"type": "RuntimeDefault"}  # podman's default
    context.pop("fsGroup")  # applied to the secret files by volume_flags
    assert not context, f"securityContext settings not translated: {context}"
    return flags


def volume_flags(
    pod: dict[str, Any], container: dict[str, Any], docs: list[Any], folder: Path
) -> list[str]:
    """The pod's volumes as podman mounts: ConfigMap and Secret items written to files as the
    kubelet does (root-owned, the secret's mode and the pod's fsGroup), emptyDirs as tmpfs."""
    objects = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    fs_group = pod["securityContext"]["fsGroup"]
    flags = []
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = mount["mountPath"]
        if "emptyDir" in volume:
            size = volume["emptyDir"]["sizeLimit"].removesuffix("Mi")
            flags += ["--tmpfs", f"{target}:rw,size={size}m,mode=1777"]
            continue
        source = folder / mount["name"]
        source.mkdir()
        if "configMap" in volume:
            data = objects[("ConfigMap", volume["configMap"]["name"])]["data"]
            items, mode, group = volume["configMap"]["items"], 0o644, 0
            files = {item["path"]: data[item["key"]].encode() for item in items}
        else:
            spec = volume["secret"]
            secret = objects[("Secret", spec["secretName"])]
            mode, group = spec["defaultMode"], fs_group
            files = {
                item["path"]: base64.b64decode(secret["data"][item["key"]])
                for item in spec["items"]
            }
        for name, content in files.items():
            path = source / name
            path.write_bytes(content)
            path.chmod(mode)
            subprocess.run(["chown", f"0:{group}", str(path)], check=True)
        source.chmod(0o755)
        flags += ["--volume", f"{source}:{target}:{'ro' if mount.get('readOnly') else 'rw'}"]
    return flags


def resource_flags(container: dict[str, Any]) -> list[str]:
    limits = container["resources"]["limits"]
    return ["--memory", limits["memory"].replace("Mi", "m"), "--cpus", limits["cpu"]]


class Container:
    """`podman run`, attached: its output goes to a file of the test's."""

    def __init__(self, image: str, flags: list[str], args: list[str], folder: Path) -> None:
        self.name = f"qe-image-test-{uuid.uuid4().hex[:12]}"
        self.log = folder / f"{self.name}.log"
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                [require("podman"), "--storage-driver", "vfs", "--runtime", "runc", "run",
                 "--name", self.name, *flags, image, *args],
                stdout=output,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)
        self.process.wait(timeout=60)


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for container in started:
        container.remove()


# -- the tests ----------------------------------------------------------------------------------


def pod_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: each downward API field
    "image-test-pod", each $(VAR) of a value expanded from the variables before it."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], item["value"])
        else:
            env[item["name"]] = "image-test-pod"
    return env


def test_serves_as_the_chart_runs_it(
    image, redis_db, redis_client, postgres_dsn, tmp_path, containers
):
    # the truth: RQ's own count of a queue, and an Attune queue_stats row
    queue = rq.Queue("image-test", connection=redis_client)
    for _ in range(3):
        queue.enqueue("tests.rq_app.jobs.sleep_for", 0.1)
    attune = Attune(postgres_dsn).create_schema()
    action = attune.add_action("core.echo")
    attune.upsert_stats(action, queue_length=7, active_count=2, max_concurrent=4)
    attune.close()

    port = free_port()
    pod, container, docs = chart_pod(
        {
            "config": {
                "presets": ["rq", "attune"],
                "sample_interval": 1,
                "sources": {"redis": {"url": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}"}},
            },
            "postgresAuth": {"dsn": postgres_dsn},
        }
    )
    # The chart's image reference is the one scripts/build-image.sh builds.
    assert container["image"] == image.reference
    env = [f"--env={name}={setting}" for name, setting in pod_env(container).items()]
    flags = [
        *security_flags(pod, container),
        *volume_flags(pod, container, docs, tmp_path),
        *resource_flags(container),
        *env,
        *HOST_LIMITS,
        "--network", "host",
    ]  # fmt: skip
    # One difference from the pod: a free port, since the host's network is shared.
    args = [*container["args"], f"--listen-address=127.0.0.1:{port}"]
    exporter = Container(image.id, flags, args, tmp_path)
    containers.append(exporter)

    def ready() -> bool:
        assert exporter.process.poll() is None, exporter.logs()
        try:
            return json.loads(scrape(port, "/readyz"))["ready"] is True
        except OSError:
            return False

    wait_for(ready, timeout=90, interval=0.5)

    def served() -> Any:
        series = parse_exposition(scrape(port))
        rq_depth = total(series, "queue_depth", system="rq", queue="image-test", state="pending")
        attune_depth = total(
            series, "queue_depth", system="attune", queue="core.echo", state="pending"
        )
        return series if (rq_depth, attune_depth) == (queue.count, 7) else None

    wait_for(served, timeout=30, interval=0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as page:
        assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        assert "queue-exporter" in page.read().decode()

    # what the process runs with, read by the kernel
    status = podman("exec", exporter.name, "cat", "/proc/1/status")
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[:2] == ["65532", "65532"]
    assert fields["Gid"].split()[:2] == ["65532", "65532"]
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capabilities], 16) == 0, capabilities
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # a filter: the runtime's default profile
    writes = podman(
        "exec", exporter.name, "python", "-c",
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').close(); print(path, 'written')\n"
        "    except OSError as error:\n"
        "        print(path, error.strerror)\n",
        "/probe", "/opt/queue-exporter/probe", "/etc/probe", "/var/tmp/probe", "/tmp/probe",
    )  # fmt: skip
    assert writes.splitlines() == [
        "/probe Read-only file system",
        "/opt/queue-exporter/probe Read-only file system",
        "/etc/probe Read-only file system",
        "/var/tmp/probe Read-only file system",
        "/tmp/probe written",  # the chart's emptyDir
    ]

    start = time.monotonic()
    podman("kill", "--signal", "TERM", exporter.name)
    code = exporter.process.wait(timeout=60)
    stopped_in = time.monotonic() - start
    assert code == 0, exporter.logs()
    assert stopped_in < STOP_BOUND, f"stopped {stopped_in:.2f} s after SIGTERM"
    assert "received SIGTERM" in exporter.logs()


@pytest.fixture(scope="module")
def idle(image: Built) -> Iterator[str]:
    """A container of the image that waits, for commands run in it (one start: with vfs each
    container copies the image): the chart's user, read-only but for /tmp (the chart's
    emptyDir), no capability, no network."""
    name = f"qe-image-test-{uuid.uuid4().hex[:12]}"
    podman(
        "run", "--detach", "--name", name, *HOST_LIMITS, "--user", "65532:65532", "--read-only",
        "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m,mode=1777", "--cap-drop=all", "--security-opt", "no-new-privileges",
        "--network", "none", "--entrypoint", "python", image.id, "-c",
        "import signal; signal.pause()",
    )  # fmt: skip
    yield name
    podman("rm", "--force", "--time", "0", name, check=False)


def run_in(container: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("podman"), "--storage-driver", "vfs", "exec", container, *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_matches_the_package(idle):
    done = run_in(idle, "queue-exporter", "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"queue-exporter, version {__version__}")


def test_demo_is_refused(idle):
    """`demo` needs the embedded servers of the [demo] extra, which the image does not ship."""
    done = run_in(idle, "queue-exporter", "demo")
    assert done.returncode == 1
    assert "queue-exporter[demo]" in done.stderr, done.stderr


# What serve loads (its command line, the app, the samplers, the PostgreSQL collectors): how
# many modules it loaded from source files, then those whose bytecode is missing or stale (the header's
# source mtime and size, as the import system checks them): the interpreter would compile
# those at each start, in memory, on the read-only root filesystem.
UNCOMPILED = """
import os, sys, importlib.util
import exporter.commands.cli, exporter.runtime.app, exporter.runtime.build, exporter.sources.postgres.source
loaded = [m for m in list(sys.modules.values()) if getattr(m, "__spec__", None)]
# the interpreter's frozen start-up modules (os, importlib.machinery, ...) need no bytecode file
sources = [m.__file__ for m in loaded if m.__spec__.origin != "frozen" and (getattr(m, "__file__", None) or "").endswith(".py")]
print(len(sources))
for source in sources:
    try:
        with open(importlib.util.cache_from_source(source), "rb") as cached:
            header = cached.read(16)
    except OSError:
        print(source)
        continue
    stat = os.stat(source)
    stamp = (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    fields = [int.from_bytes(header[i : i + 4], "little") for i in (4, 8, 12)]
    if fields[0] != 0 or tuple(fields[1:]) != stamp:
        print(source)
"""


def test_what_serve_imports_is_compiled(idle):
    """Start-up compiles nothing: the Dockerfile writes the bytecode of what the exporter
    imports, the standard library's included (the official base ships it without any)."""
    done = run_in(idle, "python", "-c", UNCOMPILED)
    assert done.returncode == 0, done.stderr
    loaded, *uncompiled = done.stdout.split()
    assert int(loaded) > 300  # the exporter's modules, its dependencies', the stdlib's
    assert uncompiled == []


# -- contents -----------------------------------------------------------------------------------

COMPILERS = re.compile(r"(.*-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|ld|as|make)(-[\d.]+)?")
# Debian's scratch folders (sticky, mode 1777); at run time the root filesystem is read-only.
STICKY_SCRATCH = {"tmp", "var/tmp", "run/lock"}


def members(container: str) -> list[tarfile.TarInfo]:
    """The image's files as a container of it has them (podman export: every layer applied;
    the container's root filesystem is read-only, so nothing of its own)."""
    export = subprocess.Popen(
        [require("podman"), "--storage-driver", "vfs", "export", container],
        stdout=subprocess.PIPE,
    )
    assert export.stdout is not None
    with tarfile.open(fileobj=export.stdout, mode="r|") as archive:
        found = list(archive)
    assert export.wait(timeout=120) == 0
    return found


def installer_or_cache(path: str) -> bool:
    """pip, setuptools or wheel (package, metadata, script or wheel file), or a package cache."""
    parts = path.split("/")
    installer = r"(pip|setuptools|wheel|_distutils_hack)(-.+\.dist-info)?"
    if any(re.fullmatch(installer, part) for part in parts):
        return True
    if re.fullmatch(r"pip[\d.]*|easy_install.*", parts[-1]) or path.endswith((".whl", ".deb")):
        return True
    if ".cache" in parts:
        return True
    apt_cache = path.startswith(("var/cache/apt/", "var/lib/apt/lists/"))
    return apt_cache and parts[-1] not in ("partial", "lock")


def test_contents(idle):
    found = members(idle)
    paths = {member.name.removeprefix("./").rstrip("/"): member for member in found}
    assert "opt/queue-exporter/bin/queue-exporter" in paths  # the venv is there
    assert any(re.search(r"site-packages/exporter/__init__\.py$", path) for path in paths)

    assert [path for path in paths if installer_or_cache(path)] == []
    binaries = [
        path
        for path, member in paths.items()
        if re.fullmatch(r"(usr/(local/)?)?s?bin/[^/]+", path)
        and COMPILERS.fullmatch(path.rsplit("/", 1)[-1])
    ]
    assert binaries == []
    assert [path for path in paths if path.rsplit("/", 1)[-1].startswith("cc1")] == []

    # nothing its user (65532:65532) may write: owned by root, no write bit for others
    owned = [path for path, member in paths.items() if 65532 in (member.uid, member.gid)]
    assert owned == []
    writable = {
        path for path, member in paths.items() if not member.issym() and member.mode & stat.S_IWOTH
    }
    assert writable <= STICKY_SCRATCH, writable - STICKY_SCRATCH
    assert all(paths[path].mode & stat.S_ISVTX for path in writable)


# -- what the Dockerfile cut from the base, and that nothing needed it -------------------------

# Every ELF file of the image (by its magic, wherever it is) and the libraries the dynamic
# loader finds for it: `ldd` says "not found" for one that a cut removed.
UNRESOLVED = """
import os, subprocess
for root in ("/usr", "/opt"):
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as file:
                if file.read(4) != b"\\x7fELF":
                    continue
            done = subprocess.run(["ldd", path], capture_output=True, text=True)
            print("checked", path)
            for line in done.stdout.splitlines():
                if "not found" in line:
                    print("unresolved", path, line.strip())
"""


def test_every_library_the_image_links_is_there(idle):
    """gconv is loaded by iconv_open, never linked; libmvec and libsqlite3 are libraries: no
    program or extension module left in the image links them."""
    done = run_in(idle, "python", "-c", UNRESOLVED)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    checked = [line.split()[1] for line in lines if line.startswith("checked ")]
    assert len(checked) > 100, checked
    assert any(path.endswith("/bin/python3.11") for path in checked)
    assert any("psycopg_binary" in path for path in checked)
    assert [line for line in lines if line.startswith("unresolved ")] == []


# The standard library's modules the Dockerfile removes, and which modules left in the image
# import them (an import statement anywhere in a module: top level, function or try block).
CUT_MODULES = (
    "sqlite3", "_sqlite3", "distutils", "_distutils_system_mod", "lib2to3", "pydoc_data",
    "turtle", "tkinter", "_tkinter", "idlelib", "turtledemo", "_testcapi", "_testinternalcapi",
    "_testbuffer", "_testclinic", "_testimportmultiple", "_testmultiphase", "_ctypes_test",
    "xxlimited", "xxlimited_35", "_xxtestfuzz",
)  # fmt: skip
IMPORTERS = """
import importlib.util, os, re, sys, sysconfig
cut = sys.argv[1:]
for name in cut:
    if importlib.util.find_spec(name) is not None:
        print("present", name)
statement = re.compile(r"^\\s*(?:from|import)\\s+(" + "|".join(cut) + r")\\b", re.M)
roots = (sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"))
for root in roots:
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as file:
                    for module in statement.findall(file.read()):
                        print("imported", os.path.relpath(path, root), module)
"""


def test_cut_modules_are_imported_by_nothing(idle):
    done = run_in(idle, "python", "-c", IMPORTERS, *CUT_MODULES)
    assert done.returncode == 0, done.stderr
    # pydoc's help() imports its topics in try blocks and says they are not available
    assert set(done.stdout.splitlines()) == {"imported pydoc.py pydoc_data"}


# Extension modules of the venv that still have a symbol table (.symtab: what strip removes),
# then one call into each that the Dockerfile stripped.
STRIPPED = """
import os, struct, sysconfig
def sections(path):
    with open(path, "rb") as file:
        data = file.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(index):
        return struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize)
    names_at = header(shstrndx)[4]
    return {data[names_at + header(i)[0]:].split(b"\\0", 1)[0].decode() for i in range(shnum)}
venv = sysconfig.get_path("purelib")
for folder, _, names in os.walk(venv):
    for name in names:
        if name.endswith(".so"):
            path = os.path.join(folder, name)
            print("extension", os.path.relpath(path, venv), ".symtab" in sections(path))
import yaml, hiredis, bcrypt, charset_normalizer.md, tornado.speedups
from google.protobuf.internal import api_implementation
from google.protobuf import timestamp_pb2
assert yaml.load("a: [1, 2]", Loader=yaml.CSafeLoader) == {"a": [1, 2]}
reader = hiredis.Reader()
reader.feed(b"*2\\r\\n:1\\r\\n$2\\r\\nok\\r\\n")
assert reader.gets() == [1, b"ok"]
assert bcrypt.checkpw(b"secret", bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)))
assert charset_normalizer.from_bytes("déjà vu, encore".encode("cp1252")).best() is not None
assert tornado.speedups.websocket_mask(b"abcd", b"abcd") == b"\\0\\0\\0\\0"
assert api_implementation.Type() == "upb"
stamp = timestamp_pb2.Timestamp(seconds=7)
assert timestamp_pb2.Timestamp.FromString(stamp.SerializeToString()).seconds == 7
print("called")
"""


def test_extension_modules_are_stripped_and_work(idle):
    done = run_in(idle, "python", "-c", STRIPPED)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    extensions = {line.split()[1]: line.split()[2] for line in lines[:-1]}
    assert "yaml/_yaml.cpython-311-x86_64-linux-gnu.so" in extensions, extensions
    assert [path for path, symbols in extensions.items() if symbols == "True"] == []
    assert lines[-1] == "called"


def test_dpkg_still_lists_every_package(idle):
    """What the Dockerfile cuts are files of packages, not packages: dpkg's database (what
    apt-based scanners read) lists them all, with the files they installed."""
    done = run_in(idle, "dpkg-query", "--show", "--showformat=${Package} ${Status}\\n")
    assert done.returncode == 0, done.stderr
    status = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    for package in ("libc6", "libsqlite3-0", "perl-base", "apt"):
        assert status.get(package) == "install ok installed", package
    listed = run_in(idle, "dpkg-query", "--listfiles", "libc6")
    assert "/usr/lib/x86_64-linux-gnu/gconv/ISO8859-1.so" in listed.stdout.split()


# In the image, with glibc's gconv modules cut: which conversions iconv still has (those glibc
# has built in), then psycopg with client encodings that iconv would need gconv for, text
# both ways (a parameter the server echoes, with a literal of its own).
ENCODINGS = """
import ctypes, sys, psycopg
libc = ctypes.CDLL(None, use_errno=True)
libc.iconv_open.restype = ctypes.c_void_p
for charset in ("ASCII", "WCHAR_T", "LATIN1", "SHIFT_JIS"):
    print("iconv", charset, libc.iconv_open(b"UTF-8", charset.encode()) not in (None, 2**64 - 1))
for encoding, text in (("LATIN1", "café"), ("SJIS", "日本語"), ("EUC_JP", "東京")):
    with psycopg.connect(sys.argv[1], client_encoding=encoding) as connection:
        (echoed,) = connection.execute("SELECT %s::text || convert_from(%s, 'UTF8')", (text, text.encode())).fetchone()
        print("postgres", encoding, connection.info.encoding, echoed == text + text)
"""


def test_postgres_client_encodings_without_gconv(image, postgres_dsn):
    done = podman(
        "run", "--rm", *HOST_LIMITS, "--user", "65532:65532", "--read-only", "--network", "host",
        "--cap-drop=all", "--entrypoint", "python", image.id, "-c", ENCODINGS, postgres_dsn,
    )  # fmt: skip
    assert done.splitlines() == [
        "iconv ASCII True",  # built into glibc: what the C.UTF-8 locale converts
        "iconv WCHAR_T True",
        "iconv LATIN1 False",  # the gconv modules are gone
        "iconv SHIFT_JIS False",
        "postgres LATIN1 iso8859-1 True",
        "postgres SJIS shift_jis True",
        "postgres EUC_JP euc_jp True",
    ]


def test_size_is_bounded(image):
    size_mb = inspect(image.id)["Size"] / 1e6
    assert size_mb <= SIZE_BOUND_MB, f"{size_mb:.0f} MB"
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert f"{SIZE_BOUND_MB} MB" in deploy  # the bound the docs state


# -- labels, references and docs agree ----------------------------------------------------------


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_labels_chart_and_docs_agree(image):
    labels = inspect(image.id)["Labels"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((ROOT / "helm/queue-exporter/Chart.yaml").read_text())
    assert labels["org.opencontainers.image.version"] == __version__ == chart["appVersion"]
    assert labels["org.opencontainers.image.title"] == pyproject["name"]
    assert labels["org.opencontainers.image.licenses"] == pyproject["license"]
    assert labels["org.opencontainers.image.description"] == pyproject["description"]
    # the last commit that changed what the build reads, and its date (git's, not the script's)
    revision = git("log", "-1", "--format=%H", "--", *BUILD_INPUTS)
    if git("status", "--porcelain", "--", *BUILD_INPUTS):
        revision += "-dirty"
    assert labels["org.opencontainers.image.revision"] == revision
    committed = int(git("log", "-1", "--format=%ct", "--", *BUILD_INPUTS))
    created = labels["org.opencontainers.image.created"]
    assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(committed)) == created
    # the Dockerfile's own default version is the package's
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG VERSION={__version__}\n" in dockerfile

    _, container, docs = chart_pod({"config": {"presets": ["rq"]}})
    assert container["image"] == image.reference
    assert one(docs, "ConfigMap")["metadata"]["labels"]["app.kubernetes.io/version"] == (
        __version__
    )
    assert kind(docs, "Deployment")
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert image.reference in deploy
    assert "bash scripts/build-image.sh" in deploy


# -- the documented commands --------------------------------------------------------------------


def test_build_is_skipped_when_nothing_changed(image):
    done = subprocess.run(
        ["bash", "scripts/build-image.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert f"{image.reference} is up to date" in done.stderr
    assert inspect(image.reference)["Id"] == image.id


def documented_commands(marker: str) -> list[str]:
    """The commands of docs/deploy.md's sh block that holds `marker`."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.S)
    (block,) = [block for block in blocks if marker in block]
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A registry of the test's own (Debian's docker-registry, the CNCF distribution server)
    on a free port, plain HTTP on 127.0.0.1: its host:port."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "storage")}},
                "http": {"addr": address},
            }
        )
    )
    server = subprocess.Popen(
        [require("docker-registry"), "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as response:
                return response.status == 200
        except OSError:
            assert server.poll() is None, "docker-registry exited"
            return False

    try:
        wait_for(answers, timeout=30, interval=0.2)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


def registry_json(url: str, accept: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_documented_push_reaches_a_registry(image, registry):
    """docs/deploy.md's push commands, run as written with the registry's host swapped for a
    local one (plain HTTP, so --tls-verify=false); the registry then serves the image's layers
    and labels."""
    commands = documented_commands("podman push")
    assert [command.split()[:2] for command in commands] == [["podman", "tag"], ["podman", "push"]]
    for command in commands:
        words = command.replace("registry.example.com", registry).split()
        if words[1] == "push":
            words.insert(2, "--tls-verify=false")
        podman(*words[1:], timeout=600)
    pushed = f"{registry}/queue-exporter:{__version__}"
    assert pushed in " ".join(commands).replace("registry.example.com", registry)

    manifest = registry_json(
        f"http://{registry}/v2/queue-exporter/manifests/{__version__}",
        "application/vnd.oci.image.manifest.v1+json, "
        "application/vnd.docker.distribution.manifest.v2+json",
    )
    config = registry_json(
        f"http://{registry}/v2/queue-exporter/blobs/{manifest['config']['digest']}", "*/*"
    )
    local = inspect(image.id)
    assert config["rootfs"]["diff_ids"] == local["RootFS"]["Layers"]
    assert len(manifest["layers"]) == len(local["RootFS"]["Layers"])
    assert config["config"]["Labels"] == local["Labels"]
    assert config["config"]["User"] == "65532:65532"
    podman("rmi", pushed)  # the tag the documented command added
