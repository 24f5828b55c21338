"""Fuzzing the configuration loader: whatever the document, only ConfigError comes out.

The event parser is fuzzed in test_events_wire.py and the item-time parsers in
test_item_time.py; this covers config.from_dict and the YAML file path of config.load.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.config import settings as config_module
from exporter.config.effective import effective_yaml
from exporter.config.settings import Config, ConfigError

# Keys the loader knows, so generated documents reach deep into every section's validators.
_KNOWN_KEYS = [
    "listen_address",
    "sample_interval",
    "log_level",
    "log_format",
    "web_config_file",
    "presets",
    "limits",
    "otlp",
    "sources",
    "leader_election",
    "redis",
    "events",
    "postgres",
    "url",
    "key_groups",
    "streams",
    "collectors",
    "name",
    "params",
    "pattern",
    "type",
    "state",
    "system",
    "queue",
    "labels",
    "values",
    "oldest",
    "due",
    "priority_bands",
    "key",
    "format",
    "group",
    "start",
    "enabled",
    "lease_ttl",
    "renew_interval",
    "identity",
    "series_idle_timeout",
    "max_series_per_metric",
    "histogram_buckets",
    "dsn",
    "query",
    "metrics",
    "interval",
    "timeout",
    "batch_size",
    "password",
    "socket_timeout",
]
_PRESETS = ["orchestrata", "attune", "rq", "bullmq", "celery", "sidekiq", "nope"]

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from([*_PRESETS, "redis://127.0.0.1:6379/0", "postgresql://x", "{queue}", "*"]),
)
_KEYS = st.one_of(st.sampled_from(_KNOWN_KEYS), st.text(max_size=10))
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(_KEYS, children, max_size=5)
    ),
    max_leaves=25,
)
_DOCUMENTS = st.dictionaries(_KEYS, _VALUES, max_size=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOCUMENTS)
def test_from_dict_raises_only_config_error(document: dict[str, Any]) -> None:
    try:
        config = config_module.from_dict(document)
    except ConfigError as error:
        assert str(error)  # a message naming the place
    else:
        assert isinstance(config, Config)
        effective_yaml(config)  # and a valid one can be shown


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["presets", "sources", "limits"]), _VALUES, min_size=1))
@pytest.mark.fast
def test_presets_and_sections_of_any_shape(document: dict[str, Any]) -> None:
    with contextlib.suppress(ConfigError):
        config_module.from_dict(document)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.text(max_size=200), _VALUES.map(yaml.safe_dump)))
@pytest.mark.fast
def test_any_file_text_raises_only_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(ConfigError):
        config_module.load(path)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    depth=st.integers(min_value=1, max_value=3000),
    opening=st.sampled_from(["[", "{a: ", "- "]),
    place=st.sampled_from(["file", "spec", "dict"]),
)
def test_values_nested_to_any_depth_raise_only_config_error(
    tmp_path: Path, depth: int, opening: str, place: str
) -> None:
    """Params, settings and specs nested to any depth: a ConfigError naming the place, never
    a RecursionError (issue 40: 1,000 deep crashed check-config and serve)."""
    if opening == "- ":  # block style: one level a line, each indented further
        value = "".join(f"\n{'  ' * level}- " for level in range(depth)) + "x"
    else:
        value = opening * depth + "x" + ("]" if opening == "[" else "}") * depth
    nested: Any = "x"
    for _ in range(depth):
        nested = [nested]
    with contextlib.suppress(ConfigError):
        if place == "file":
            path = tmp_path / "config.yaml"
            path.write_text(f"presets:\n  - name: celery\n    params:\n      queues: {value}\n")
            config_module.load(path)
        elif place == "spec" and opening != "- ":
            config_module.load(None, {"preset": (f"celery:queues={value}",)})
        else:
            config_module.from_dict({"presets": [{"name": "celery", "params": {"queues": nested}}]})
