"""Presets: configuration fragments, one YAML file per known queue layout.

A preset file holds `description`, `params` (defaults an operator may override), optionally
`library` (the versions tested and how each state the library holds is served) and a piece
of the ordinary configuration (`sources: ...`) in which `${param}` is substituted
(`${param|pattern}`: as literal text of a key pattern, its braces doubled, so that a hash-tagged
prefix such as BullMQ's `{bull}` is not read as a placeholder; `${!param}`, a whole value: the
negation of a true/false param, to enable one of two exclusive collectors). Loading a
preset merges that piece into the configuration: lists are extended, so a preset's key
groups join the operator's own.

On the command line and in QUEUE_EXPORTER_PRESET a preset is named with its params in one
string, `NAME:PARAM=VALUE;PARAM=VALUE` (parse_spec), e.g. `celery:queues=a,b;native=false`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from exporter.core import nesting
from exporter.sources.redis_keys.groups import literal

_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\|pattern)?\}")
_NEGATED = re.compile(r"\$\{!([A-Za-z_][A-Za-z0-9_]*)\}")
# The preset files sit beside this module: the package is installed as files (pip, the
# Dockerfile), and reading them as such spares start-up importlib.resources (tempfile, shutil).
_DIRECTORY = Path(__file__).parent


# Top-level keys of a preset file that document it instead of configuring anything: the
# description, the params' defaults, and `library` (versions tested, and what the library holds
# -> what is served, for docs/presets.md).
DOCUMENTATION_KEYS = ("description", "params", "library")


class PresetError(ValueError):
    pass


def available() -> list[str]:
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in _DIRECTORY.iterdir()
        if entry.name.endswith(".yaml")
    )


def describe(name: str) -> str:
    return str(read(name).get("description", "")).strip()


def expand(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The configuration fragment of preset `name` with its parameters substituted."""
    document = read(name)
    values = {**document.get("params", {}), **(params or {})}
    _refuse_unknown(name, set(params or {}), sorted(document.get("params", {})))
    fragment = {k: v for k, v in document.items() if k not in DOCUMENTATION_KEYS}
    substituted: dict[str, Any] = _substitute(fragment, values, name)
    return substituted


def _refuse_unknown(name: str, given: set[str], valid: list[str]) -> None:
    unknown = sorted(given - set(valid))
    if not unknown:
        return
    guesses = [difflib.get_close_matches(param, valid, n=1) for param in unknown]
    hints = [f"did you mean {guess[0]!r}? " for guess in guesses if guess]
    raise PresetError(
        f"preset {name}: unknown params {', '.join(unknown)} "
        f"({''.join(hints)}valid: {', '.join(valid) or 'none'})"
    )


def parse_spec(text: str) -> str | dict[str, Any]:
    """A preset as `--preset` and QUEUE_EXPORTER_PRESET name it: `NAME`, or
    `NAME:PARAM=VALUE;PARAM=VALUE`, as the file's `{name, params}`. A value takes the type of
    the param's default: a list is split at commas (`queues=a,b`; empty: `queues=`), a boolean
    is true/false, a number a number; a value starting with `[`, `{` or `"` is read as YAML
    (`sep="\\x06\\x16"`, `priorities={1: low, 2: high}`)."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not colon:
        return name
    defaults = read(name).get("params", {})
    params: dict[str, Any] = {}
    for assignment in (part for part in rest.split(";") if part.strip()):
        param, equals, value = assignment.partition("=")
        param = param.strip()
        if not equals or not param:
            raise PresetError(
                f"preset {name}: {assignment.strip()!r} is not PARAM=VALUE "
                "(NAME:PARAM=VALUE;PARAM=VALUE)"
            )
        if param in params:
            raise PresetError(f"preset {name}: param {param} given twice")
        params[param] = _spec_value(name, param, value.strip(), defaults.get(param))
    _refuse_unknown(name, set(params), sorted(defaults))
    return {"name": name, "params": params}


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _spec_value(preset: str, param: str, text: str, default: Any) -> Any:
    """`text` as a value of the param's type (its default's)."""
    if text[:1] in ("[", "{", '"'):
        try:
            return nesting.load_yaml(text)
        except nesting.TooDeep as error:
            raise PresetError(f"preset {preset}: param {param}: {error.where}") from None
        except yaml.YAMLError as error:
            problem = getattr(error, "problem", None) or "not valid YAML"
            raise PresetError(f"preset {preset}: param {param}: {problem}: {text!r}") from None
    if isinstance(default, list):
        return [item.strip() for item in text.split(",")] if text else []
    if isinstance(default, bool):
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise PresetError(f"preset {preset}: param {param}: expected true or false, got {text!r}")
    if isinstance(default, int | float):
        try:
            return int(text) if isinstance(default, int) else float(text)
        except ValueError:
            kind = type(default).__name__
            raise PresetError(
                f"preset {preset}: param {param}: expected a number ({kind}), got {text!r}"
            ) from None
    if isinstance(default, dict):
        raise PresetError(
            f"preset {preset}: param {param}: a mapping, given as YAML: {param}={{KEY: VALUE}}"
        )
    return text


def merge(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `fragment` under `base`: lists concatenate (the base's items first, so the
    paths in error messages match the operator's file), the base's scalars win."""
    merged = dict(fragment)
    for key, value in base.items():
        other = merged.get(key)
        if isinstance(value, dict) and isinstance(other, dict):
            merged[key] = merge(value, other)
        elif isinstance(value, list) and isinstance(other, list):
            merged[key] = value + other
        else:
            merged[key] = value
    return merged


def read(name: str) -> dict[str, Any]:
    known = available()
    if name not in known:
        guess = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        raise PresetError(f"unknown preset {name!r} ({hint}known: {', '.join(known)})")
    text = (_DIRECTORY / f"{name}.yaml").read_text()
    # libyaml's loader when installed (PyYAML's wheels have it): 6x faster on these files
    document: dict[str, Any] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return document


def _substitute(value: Any, params: dict[str, Any], preset: str) -> Any:
    if isinstance(value, dict):
        return {key: _substitute(item, params, preset) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, params, preset) for item in value]
    if not isinstance(value, str):
        return value
    negated = _NEGATED.fullmatch(value)
    if negated:
        return not _flag(negated.group(1), params, preset)
    whole = _PARAM.fullmatch(value)
    if whole and not whole.group(2):  # a whole-string reference keeps the parameter's type
        return _param(whole.group(1), params, preset)
    return _PARAM.sub(lambda match: _text(match, params, preset), value)


def _text(match: re.Match[str], params: dict[str, Any], preset: str) -> str:
    text = str(_param(match.group(1), params, preset))
    return literal(text) if match.group(2) else text


def _param(name: str, params: dict[str, Any], preset: str) -> Any:
    if name not in params:
        raise PresetError(f"preset {preset}: no param {name!r}")
    return params[name]


def _flag(name: str, params: dict[str, Any], preset: str) -> bool:
    value = _param(name, params, preset)
    if not isinstance(value, bool):
        raise PresetError(f"preset {preset}: param {name}: expected true or false, got {value!r}")
    return value
