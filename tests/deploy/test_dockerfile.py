"""The Dockerfile, read as text (tests/deploy/test_image.py builds and runs it): multi-stage, a slim
base, no build tools in the stages that make the image, a non-root user matching the chart's,
the console script as entrypoint, OCI labels."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
REQUIRED_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.created",
    "org.opencontainers.image.licenses",
)
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|build-essential|python3?-dev|libpq-dev|pip install|apt-get)\b"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [argument for name, argument in self.instructions if name == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    parsed = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, argument = line.strip().partition(" ")
            parsed.append((keyword.upper(), " ".join(argument.split())))
    return parsed


def stages(parsed: list[tuple[str, str]]) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults (usable in FROM) and the stages in order."""
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, argument in parsed:
        if keyword == "FROM":
            words = argument.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        elif not found:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            arg_name, _, default = argument.partition("=")
            global_args[arg_name] = default
        else:
            found[-1].instructions.append((keyword, argument))
    return global_args, found


def labels(stage: Stage) -> dict[str, str]:
    found: dict[str, str] = {}
    for argument in stage.all("LABEL"):
        for pair in shlex.split(argument):
            key, _, value = pair.partition("=")
            found[key] = value
    return found


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return stages(instructions(DOCKERFILE.read_text()))


def image_stages(found: list[Stage]) -> list[Stage]:
    """The final stage and the stages whose whole root filesystem it copies (`COPY --from=x / /`
    onto `FROM scratch`): what ends up in the image."""
    by_name = {stage.name: stage for stage in found if stage.name}
    chain = [found[-1]]
    while roots := [
        copy.split()[0].removeprefix("--from=")
        for copy in chain[-1].all("COPY")
        if copy.startswith("--from=") and copy.split()[1:] == ["/", "/"]
    ]:
        (root,) = roots
        chain.append(by_name[root])
    return chain


def test_multi_stage_on_a_slim_base(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, found = parsed
    assert len(found) >= 2
    build, final = found[0], found[-1]
    assert build.name
    image = image_stages(found)
    for stage in found:
        if stage is final and stage.base == "scratch":
            assert len(image) > 1, "FROM scratch copies the root of a stage on the slim base"
            continue
        base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], stage.base)
        assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base
    copies = [copy for stage in image for copy in stage.all("COPY")]
    assert any(copy.startswith(f"--from={build.name} ") for copy in copies)


def test_no_build_tools_in_the_image(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    for stage in image_stages(parsed[1]):
        for run in stage.all("RUN"):
            assert not BUILD_TOOLS.search(run), run
        # The project's sources stay in the build stage: only the built venv is copied.
        assert all(copy.startswith("--from=") for copy in stage.all("COPY"))


def test_runs_as_the_charts_non_root_user(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    final = parsed[1][-1]
    user = final.all("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, "a numeric non-root uid (runAsNonRoot checks it)"
    assert gid.isdigit() and int(gid) >= 1000
    # the instruction after which nothing runs as root
    last_user = max(i for i, (keyword, _) in enumerate(final.instructions) if keyword == "USER")
    assert all(keyword != "RUN" for keyword, _ in final.instructions[last_user:])
    values = yaml.safe_load((ROOT / "helm" / "queue-exporter" / "values.yaml").read_text())
    for context in (values["securityContext"], values["podSecurityContext"]):
        assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))
    created = " ".join(run for stage in image_stages(parsed[1]) for run in stage.all("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created


def test_entrypoint_is_the_console_script(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    final = parsed[1][-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["queue-exporter"]  # exec form: signals reach the process
    assert json.loads(final.all("CMD")[-1]) == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["queue-exporter"] == "exporter.__main__:main"  # as python -m exporter
    env = " ".join(final.all("ENV"))
    assert "PATH=/opt/queue-exporter/bin:" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only
    assert final.all("EXPOSE") == ["9839"]


def test_oci_labels(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    found = labels(parsed[1][-1])
    for key in REQUIRED_LABELS:
        assert found.get(key), key
    assert found["org.opencontainers.image.title"] == "queue-exporter"
    license_ = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert found["org.opencontainers.image.licenses"] == license_


def test_build_context_leaves_out_the_work_tree() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = ("!pyproject.toml", "!README.md", "!exporter/")
    # everything out (.venv, .git, tests), then the allow-list of what the build stage copies
    assert all(ignored.index(entry) > ignored.index("*") for entry in allowed)
