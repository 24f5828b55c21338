"""The exporter's configuration: a YAML file, QUEUE_EXPORTER_* variables and flags, merged.

Flags beat environment variables, which beat the file. Presets are expanded into the
configuration before it is validated, so a preset's key groups are checked like an
operator's own. Every error names its place: `sources.redis.key_groups[2].pattern: ...`.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from exporter.config import presets
from exporter.core import nesting
from exporter.core.models import StrictModel
from exporter.http.config import HttpConfig
from exporter.leader.config import LeaderElectionConfig
from exporter.output.catalog import SIGNAL_WHAT
from exporter.output.telemetry_config import LimitsConfig, OtlpConfig
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.readers.config import NativeConfig
from exporter.sources.readers.registry import READERS
from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.streams.config import EventsSourceConfig

DEFAULT_LISTEN_ADDRESS = "0.0.0.0:9839"
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(\d{1,5})$")


class ConfigError(Exception):
    """Invalid configuration; the message lists every problem with its path."""


class PresetRef(StrictModel):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


def _redis_form(value: Any) -> str:
    return "RedisSources" if isinstance(value, list) else "RedisSource"


# One Redis (a mapping) or several (a list of mappings, each named). The tags keep pydantic
# from reporting a mapping's errors twice (once per form); _error_path leaves them out.
RedisSources = Annotated[
    Annotated[RedisSourceConfig, Tag("RedisSource")]
    | Annotated[list[RedisSourceConfig], Tag("RedisSources")],
    Discriminator(_redis_form),
]


class SourcesConfig(StrictModel):
    redis: RedisSources | None = Field(
        None,
        description="one Redis (a mapping), or several (a list, each with its own name; every "
        "queue and job series then carries a redis_source label: key samples, events and "
        "native readers, and so do the exporter's own series of each stream and reader)",
    )
    events: EventsSourceConfig | None = None
    postgres: PostgresSourceConfig | None = None
    native: NativeConfig | None = None

    @field_validator("redis")
    @classmethod
    def _named_when_several(
        cls, value: RedisSourceConfig | list[RedisSourceConfig] | None
    ) -> RedisSourceConfig | list[RedisSourceConfig] | None:
        if not isinstance(value, list):
            return value
        names = [source.name for source in value]
        if None in names:
            raise ValueError(f"each Redis of the list needs a name (entry {names.index(None)})")
        duplicated = sorted({name for name in names if name and names.count(name) > 1})
        if duplicated:
            raise ValueError(f"Redis name listed twice: {', '.join(duplicated)}")
        return value

    @model_validator(mode="after")
    def _streams_told_apart(self) -> SourcesConfig:
        """A stream key listed twice is refused unless its series can tell the two apart:
        with several Redis sources, on two servers (each its own redis_source)."""
        events = self.events
        if events is None:
            return self
        places = [(s.key, self.redis_source(s.redis or events.redis)) for s in events.streams]
        twice = sorted({place for place in places if places.count(place) > 1}, key=str)
        if not twice:
            return self
        if not self.several_redis():
            keys = ", ".join(key for key, _ in twice)
            raise ValueError(
                f"stream listed twice: {keys} (a key on two servers needs sources.redis as a "
                "list: their series then carry redis_source)"
            )
        named = ", ".join(f"{key} (redis_source {source})" for key, source in twice)
        raise ValueError(f"stream listed twice on one Redis: {named}")

    def redis_list(self) -> list[RedisSourceConfig]:
        """Every Redis source, whichever form configured them."""
        if self.redis is None:
            return []
        return self.redis if isinstance(self.redis, list) else [self.redis]

    def default_redis(self) -> RedisSourceConfig | None:
        """The connection events, native readers and the lease use when they name none: the
        one Redis, or the first of several."""
        return next(iter(self.redis_list()), None)

    def several_redis(self) -> bool:
        """Whether series carry redis_source: sources.redis is a list (the key sampler's rule;
        a repeated --redis-url makes one). One Redis, and nothing changes."""
        return isinstance(self.redis, list) and bool(self.redis)

    def events_redis(self) -> RedisConnectionConfig:
        """Where the event streams are read: events.redis, else the default Redis's connection."""
        if self.events is not None and self.events.redis is not None:
            return self.events.redis
        return self.default_redis() or RedisConnectionConfig()

    def redis_source(self, connection: RedisConnectionConfig | None) -> str | None:
        """The redis_source of the series read from `connection` (None: the default one), when
        there are several Redis sources: the name of the first listed source on the same
        server, else the server itself (host:port/db, RedisConnectionConfig.server)."""
        default = self.default_redis()
        if not self.several_redis() or default is None:
            return None
        server = (connection or default).server
        return next((s.name for s in self.redis_list() if s.server == server and s.name), server)


class Config(StrictModel):
    listen_address: str = Field(DEFAULT_LISTEN_ADDRESS, description="HOST:PORT to serve on")
    sample_interval: float = Field(15.0, gt=0, description="seconds between samples")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="least severe level logged"
    )
    log_format: Literal["text", "json"] = Field("text", description="json: one object a line")
    web_config_file: Path | None = Field(None, description="exporter-toolkit web config")
    http: HttpConfig = Field(default_factory=HttpConfig)
    presets: list[str | PresetRef] = Field(
        default_factory=list, description="names, or {name, params} (docs/presets.md)"
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)
    messaging_conventions: bool = Field(
        False,
        description="also serve the job families that OpenTelemetry's messaging semantic "
        "conventions (status: development) name, under those names, on /metrics and over "
        "OTLP (docs/metrics.md)",
    )
    sources: SourcesConfig = Field(default_factory=SourcesConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    not_recorded: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="per system, the signals (catalog.SIGNALS) it does not record and why; "
        "the presets fill it: named on the status page and by check-config, never made up",
    )

    @field_validator("not_recorded")
    @classmethod
    def _known_signals(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for system, signals in value.items():
            for name in signals:
                if name not in SIGNAL_WHAT:
                    guess = difflib.get_close_matches(name, list(SIGNAL_WHAT), n=1)
                    hint = f"did you mean {guess[0]!r}? " if guess else ""
                    raise ValueError(
                        f"{system}: unknown signal {name!r} ({hint}signals: "
                        f"{', '.join(SIGNAL_WHAT)})"
                    )
        return value

    @field_validator("listen_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        match = _HOST_PORT.match(value)
        if not match or not 0 <= int(match.group(2)) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @model_validator(mode="after")
    def _no_cluster_for_readers_of_systems_that_refuse_one(self) -> Config:
        """RQ, Celery (kombu's Redis transport) and Sidekiq do not run on a Redis Cluster
        (their own commands span keys of many slots): a reader of theirs given one is refused
        here, naming the setting, rather than failing at every read. BullMQ with a hash-tagged
        prefix, Runner-Q streams and the lease run on a cluster."""
        default = self.sources.default_redis()
        native = self.sources.native
        readers = native.enabled_by_name().items() if native is not None else ()
        clustered = [
            f"sources.native.{name}"
            for name, reader in readers
            if not READERS[name].on_a_cluster and _is_cluster(reader.redis or default)
        ]
        if clustered:
            raise ValueError(
                f"{', '.join(clustered)}: RQ, Celery (kombu's Redis transport) and Sidekiq do not "
                "run on a Redis Cluster (their own commands span keys of many slots), so a reader "
                "of theirs needs a redis:// or redis+sentinel:// URL: give it one (its redis "
                "setting) or turn it off (preset param native: false)"
            )
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen_address.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)


def _is_cluster(connection: RedisConnectionConfig | None) -> bool:
    # No connection at all: the default, redis://localhost, is one server.
    return connection is not None and connection.is_cluster


# Flags and their QUEUE_EXPORTER_* variables: where each lands in the file's structure.
OVERRIDE_PATHS: dict[str, tuple[str, ...]] = {
    "redis_url": ("sources", "redis", "url"),
    "events_stream": ("sources", "events", "streams"),
    "postgres_dsn": ("sources", "postgres", "dsn"),
    "listen_address": ("listen_address",),
    "sample_interval": ("sample_interval",),
    "log_level": ("log_level",),
    "log_format": ("log_format",),
    "web_config": ("web_config_file",),
    "preset": ("presets",),
}


def load(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read, merge and validate; raise ConfigError naming every problem and its place."""
    raw = _read_file(path) if path else {}
    for name, value in (overrides or {}).items():
        if value is None or value == ():
            continue
        if name == "redis_url" and isinstance(value, tuple) and len(value) > 1:
            _set_redis_urls(raw, value)
            continue
        if name == "redis_url" and isinstance(value, tuple):
            value = value[0]
        if name == "preset":
            value = _preset_specs(value)
        set_path(raw, OVERRIDE_PATHS[name], list(value) if isinstance(value, tuple) else value)
    return from_dict(raw, f" in {path}" if path else "")


def _preset_specs(specs: tuple[str, ...] | list[str]) -> list[str | dict[str, Any]]:
    """--preset / QUEUE_EXPORTER_PRESET values (`NAME` or `NAME:PARAM=VALUE;...`) as the
    file's preset entries, checked as the file's are."""
    entries = []
    for index, spec in enumerate(specs):
        try:
            entries.append(presets.parse_spec(spec))
        except presets.PresetError as error:
            raise ConfigError(
                f"invalid configuration:\n  --preset {_shown(spec)} (presets[{index}]): {error}"
            ) from None
    return entries


def _shown(text: str, length: int = 80) -> str:
    """`text` quoted for an error message, cut to its first `length` characters."""
    return repr(text) if len(text) <= length else f"{text[:length]!r}... ({len(text)} characters)"


def from_dict(raw: dict[str, Any], where: str = "") -> Config:
    """Expand presets and validate a configuration already read."""
    deep = nesting.too_deep(raw)
    if deep is not None:  # before the presets' merge and substitution recurse into it
        raise ConfigError(
            f"invalid configuration{where}:\n  {deep}: nested deeper than {nesting.MAX_DEPTH} "
            "levels"
        )
    raw = _expand_presets(raw, where)
    try:
        return Config.model_validate(raw)
    except ValidationError as error:
        lines = [
            f"  {_error_path(item['loc'])}: {item['msg']}{_did_you_mean(item)}"
            for item in error.errors()
        ]
        raise ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines)) from None


def _did_you_mean(error: Any) -> str:
    """For an unknown setting, the known one it most resembles (a typo is the usual cause)."""
    if error["type"] != "extra_forbidden" or not isinstance(error["loc"][-1], str):
        return ""
    guess = difflib.get_close_matches(error["loc"][-1], _setting_names(), n=1)
    return f" (did you mean {guess[0]!r}?)" if guess else ""


@functools.cache
def _setting_names() -> list[str]:
    schema = Config.model_json_schema()
    names = set(schema["properties"])
    for definition in schema.get("$defs", {}).values():
        names |= set(definition.get("properties", {}))
    return sorted(names)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    try:
        document = nesting.load_yaml(text)
    except nesting.TooDeep as error:
        raise ConfigError(f"{path}: {error.where}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(document).__name__}")
    return document


def _set_redis_urls(raw: dict[str, Any], urls: tuple[str, ...]) -> None:
    """`--redis-url` given more than once: one Redis source per URL, named redis1, redis2...,
    each sampling the key groups the file gives (one Redis of the file's, or its first)."""
    sources = raw.setdefault("sources", {})
    given = sources.get("redis") or {}
    template = given[0] if isinstance(given, list) and given else given
    template = template if isinstance(template, dict) else {}
    sources["redis"] = [
        {**template, "name": f"redis{number}", "url": url}
        for number, url in enumerate(urls, start=1)
    ]


def set_path(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = raw
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _expand_presets(raw: dict[str, Any], where: str) -> dict[str, Any]:
    refs = raw.get("presets") or []
    if not isinstance(refs, list):
        return raw  # validation reports the wrong type
    for index, ref in enumerate(refs):
        if not isinstance(ref, str | dict):
            continue  # validation reports the wrong type
        name, params = (ref, {}) if isinstance(ref, str) else (ref.get("name"), ref.get("params"))
        if not isinstance(params, dict | None):
            raise ConfigError(
                f"invalid configuration{where}:\n  presets[{index}].params: not a mapping"
            )
        try:
            raw = _merge_preset(raw, presets.expand(str(name), params or {}))
        except presets.PresetError as error:
            raise ConfigError(
                f"invalid configuration{where}:\n  presets[{index}]: {error}"
            ) from None
    return _expand_source_presets(raw, where)


def _merge_preset(raw: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """A top-level preset: with several Redis sources, its key groups go to each of them."""
    several = raw.get("sources", {}).get("redis") if isinstance(raw.get("sources"), dict) else None
    if not isinstance(several, list):
        return presets.merge(raw, fragment)
    redis_part = fragment.get("sources", {}).pop("redis", None)
    raw = presets.merge(raw, fragment)
    if redis_part is not None:
        raw["sources"]["redis"] = [
            presets.merge(entry, redis_part) if isinstance(entry, dict) else entry
            for entry in several
        ]
    return raw


def _expand_source_presets(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Each listed Redis's own presets: their key groups, for that Redis alone."""
    sources = raw.get("sources")
    several = sources.get("redis") if isinstance(sources, dict) else None
    if not isinstance(sources, dict) or not isinstance(several, list):
        return raw
    expanded = []
    for position, entry in enumerate(several):
        refs = entry.get("presets") if isinstance(entry, dict) else None
        for index, ref in enumerate(refs if isinstance(refs, list) else []):
            name, params = (
                (ref, {}) if isinstance(ref, str) else (ref.get("name"), ref.get("params"))
            )
            try:
                fragment = presets.expand(str(name), params if isinstance(params, dict) else {})
            except presets.PresetError as error:
                place = f"sources.redis[{position}].presets[{index}]"
                raise ConfigError(f"invalid configuration{where}:\n  {place}: {error}") from None
            entry = presets.merge(entry, fragment.get("sources", {}).get("redis", {}))
        expanded.append(entry)
    return {**raw, "sources": {**sources, "redis": expanded}}


def _error_path(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _is_union_tag(part):
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _is_union_tag(part: str) -> bool:
    # pydantic names the union member it tried ("str", "PresetRef", "function-after[...]")
    return part[:1].isupper() or part in ("str", "int", "float") or "[" in part
