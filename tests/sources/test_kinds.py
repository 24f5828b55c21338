"""The registries of source kinds (config/kinds.py), native readers (readers/registry.py) and
stream formats (streams/formats.py): every record has every hook and matches its settings
model, and the modules that treat kinds alike dispatch through them, never by hand."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from exporter.config import settings
from exporter.config.kinds import KINDS, Inventoried, SourceKind
from exporter.redis.acl import RedisNeeds
from exporter.sources.readers.config import NativeConfig, ReaderConfig
from exporter.sources.readers.registry import READERS, ReaderKind
from exporter.sources.streams.config import StreamConfig
from exporter.sources.streams.formats import FORMATS, StreamFormat

ROOT = Path(__file__).resolve().parents[2] / "exporter"
# The modules that treat source kinds, readers or formats alike: they loop over a registry.
DISPATCHERS = [
    "runtime/build.py",
    "commands/check_config.py",
    "commands/redis_acl.py",
    "config/inventory.py",
    "config/effective.py",
    "config/kinds.py",
    "config/settings.py",
    "sources/readers/__init__.py",
    "sources/readers/probe.py",
    "sources/readers/acl.py",
    "sources/redis_keys/probe.py",
    "sources/redis_keys/acl.py",
    "sources/postgres/probe.py",
    "sources/streams/consumer.py",
    "sources/streams/probe.py",
    "sources/streams/acl.py",
]
# A configuration with every kind: key groups, SQL collectors, finished rows, streams of each
# format, every reader.
EVERY_KIND = {
    "presets": ["orchestrata", "attune"],
    "sources": {
        "redis": {"url": "redis://127.0.0.1:1/0"},
        "postgres": {"dsn": "postgresql://u:secret@127.0.0.1:1/db"},
        "events": {
            "streams": [{"key": name, "format": name} for name in FORMATS],
            "redis": {"url": "redis://:secret@127.0.0.1:2/0"},
        },
        "native": {name: {} for name in READERS},
    },
}


def _hooks(record_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(record_type) if f.name not in ("name",)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_every_source_kind_has_every_hook_and_its_section(kind: SourceKind):
    for hook in _hooks(SourceKind):
        assert getattr(kind, hook) is not None, f"{kind.name}: no {hook}"
    for hook in ("build", "feeds_events", "probe", "acl", "inventory", "mask"):
        assert callable(getattr(kind, hook)), f"{kind.name}: {hook} is not callable"
    field = settings.SourcesConfig.model_fields[kind.section]
    assert kind.config_type.__name__ in str(field.annotation), (kind.section, field.annotation)


def test_every_section_of_sources_is_a_registered_kind():
    assert sorted(kind.section for kind in KINDS) == sorted(settings.SourcesConfig.model_fields)


def test_the_light_hooks_of_every_kind_answer_for_a_configuration_of_every_kind():
    config = settings.from_dict(EVERY_KIND)
    document = config.model_dump(mode="json", exclude_none=True)
    for kind in KINDS:
        assert isinstance(kind.acl(config), RedisNeeds)
        assert isinstance(kind.inventory(config), Inventoried)
        assert isinstance(kind.feeds_events(config), bool)
        kind.mask(config, document)
    assert "secret" not in str(document)
    kinds_seen = [kind for kind in KINDS if kind.inventory(config).sources]
    assert kinds_seen == list(KINDS)  # each kind found its part of the configuration


@pytest.mark.parametrize("name", READERS)
def test_every_reader_has_every_hook_and_its_section(name: str):
    kind = READERS[name]
    assert kind.name == name
    assert issubclass(kind.config_type, ReaderConfig)
    assert callable(kind.open)
    assert kind.watch is None or callable(kind.watch)
    field = NativeConfig.model_fields[name]
    assert typing.get_args(field.annotation)[0] is kind.config_type
    assert {f.name for f in dataclasses.fields(ReaderKind)} >= {"open", "config_type"}


def test_every_section_of_native_is_a_registered_reader():
    assert list(NativeConfig.model_fields) == list(READERS)


@pytest.mark.parametrize("name", FORMATS)
def test_every_stream_format_has_a_decoder_and_is_a_format_name(name: str):
    record = FORMATS[name]
    assert isinstance(record, StreamFormat) and record.name == name
    assert callable(record.open)
    assert all(isinstance(command, str) for command in record.acl_commands)


def test_the_format_names_are_the_registered_formats():
    names = typing.get_args(StreamConfig.model_fields["format"].annotation)
    assert sorted(names) == sorted(FORMATS)


def _config_types() -> set[str]:
    """The names of every settings model of the package (a class named *Config)."""
    names = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
                names.add(node.name)
    return names


def _hand_dispatch(path: Path, config_types: set[str]) -> list[str]:
    """isinstance(x, <a settings model>) and `<x>.format == "<name>"`: what a registry says."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            classes = node.args[1]
            named = classes.elts if isinstance(classes, ast.Tuple) else [classes]
            for name in named:
                text = ast.unparse(name)
                if text.rpartition(".")[2] in config_types:
                    found.append(f"{path.name}:{node.lineno} isinstance(..., {text})")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            by_format = any(isinstance(s, ast.Attribute) and s.attr == "format" for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            if by_format and literal:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_checker_finds_a_hand_dispatch(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "if isinstance(reader, CeleryReaderConfig):\n    pass\n"
        'if stream.format == "runnerq":\n    pass\n'
    )
    assert len(_hand_dispatch(planted, {"CeleryReaderConfig"})) == 2


@pytest.mark.parametrize("module", DISPATCHERS)
def test_no_isinstance_dispatch_on_settings_models(module: str):
    assert _hand_dispatch(ROOT / module, _config_types()) == []
