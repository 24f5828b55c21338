"""How deep an operator's input may nest: YAML read with a bound, and values checked for one.

PyYAML composes a document by recursion, as do the preset merge and substitution: params
nested 1,000 deep (a 2 KB string, through --preset, QUEUE_EXPORTER_PRESET or a file) ended
check-config and serve in a RecursionError. Here the composer counts its depth and stops at
MAX_DEPTH, naming the line and column; and a value built otherwise (an alias that contains
itself, a dict from code) is walked without recursion before anything recursive reads it.
No configuration needs a tenth of MAX_DEPTH.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
import yaml.composer
import yaml.nodes

# Levels of nesting (mappings and lists) any input may have.
MAX_DEPTH = 32


class TooDeep(yaml.composer.ComposerError):
    """A YAML document nested deeper than MAX_DEPTH; `where` names the line and column."""

    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        self.where = f"line {mark.line + 1} column {mark.column + 1}: {self.problem}"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a node below MAX_DEPTH levels before composing it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.nodes.Node | None, index: Any) -> yaml.nodes.Node | None:
        if self._depth >= MAX_DEPTH:
            raise TooDeep(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing a document nested deeper than MAX_DEPTH (TooDeep, a
    yaml.YAMLError naming the line and column)."""
    return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: no object is built


def too_deep(value: Any) -> str | None:
    """The path (`a.b[2]`) of the first list or mapping in `value` below MAX_DEPTH levels, else
    None. Walked without recursion, each list or mapping again only when reached deeper than
    before: an alias that contains itself is found as too deep, and aliases of aliases (a
    "billion laughs") cost their distinct values, not the paths to them."""
    deepest: dict[int, int] = {}  # by id(): every value walked is held by `value` meanwhile
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, place, depth = stack.pop()
        if not isinstance(node, dict | list) or deepest.get(id(node), -1) >= depth:
            continue
        if depth >= MAX_DEPTH:
            return place or "(top level)"
        deepest[id(node)] = depth
        stack.extend((child, _join(place, step), depth + 1) for step, child in _children(node))
    return None


def _children(node: dict[Any, Any] | list[Any]) -> Iterator[tuple[int | str, Any]]:
    if isinstance(node, list):
        return enumerate(node)
    return ((str(key), item) for key, item in node.items())


def _join(place: str, step: int | str) -> str:
    if isinstance(step, int):
        return f"{place}[{step}]"
    return f"{place}.{step}" if place else str(step)
