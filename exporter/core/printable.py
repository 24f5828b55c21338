"""Text a person reads, with what they cannot see made visible: the one home of that escaping.

Celery's kombu keys hold the separator `\\x06\\x16` (`celery\\x06\\x163`), and any key or queue
name may hold control bytes. Printed as they are, a terminal or a browser shows nothing where
they stand (`celery3`), so a person cannot type the key back. check-config, the log and the
status page's text pass every key, separator and name through `printable`.
"""

from __future__ import annotations

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def printable(text: str) -> str:
    """`text` with backslashes doubled and every unprintable character escaped: `\\n`, `\\t`,
    `\\r`, `\\xNN` (below U+0100), `\\uNNNN` or `\\UNNNNNNNN`. Printable text is returned as is."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escaped(character) for character in text)


def _escaped(character: str) -> str:
    known = _ESCAPES.get(character)
    if known is not None:
        return known
    if character.isprintable():
        return character
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
