"""`printable`: what a person reads shows every control character, and escapes back to the
text it came from (Python's own unicode_escape decoder is the judge)."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.printable import printable

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def test_celery_separator_and_key_print_escaped():
    assert printable("\x06\x16") == "\\x06\\x16"
    assert printable("celery\x06\x163") == "celery\\x06\\x163"
    assert printable("jobs:email") == "jobs:email"
    assert printable("tab\there\nnew\\") == "tab\\there\\nnew\\\\"
    assert printable("é ü 日本") == "é ü 日本"
    assert printable("\u200b") == "\\u200b"


@given(st.text())
def test_printable_is_visible_and_reversible(text):
    shown = printable(text)
    assert all(character.isprintable() for character in shown)
    assert _unescape(shown) == text


def _unescape(shown: str) -> str:
    """Python's decoder reads the escapes; the printable characters pass through it as
    themselves (each escaped to \\uNNNN first, so the decoder never sees raw non-ASCII)."""
    ascii_only = "".join(c if ord(c) < 0x80 else f"\\U{ord(c):08x}" for c in shown)
    return codecs.decode(ascii_only, "unicode_escape")
