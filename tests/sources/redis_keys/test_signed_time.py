"""time_in: signed reads the time a Django signing.dumps token was signed (django-q2's queued
tasks) from its base-62 part alone; anything else is a named error, never a made-up time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.sources.redis_keys.items import ItemError, exception_reason, signed_at

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Made by Django 5.2's signing.dumps at 1796561039 (plain and compressed payloads)
PLAIN = b"eyJhIjoxfQ:1xaBax:UFhTCqdu4KFyI8tkTSZcVdOxNvFhzmeCAPlzG1h_vOE"
COMPRESSED = b".eJxTShwFgwooAQCJ6ZfV:1xaBax:4j7NyTEn9wmr-a3jihFIuEW6sp1Es-ANf6xKQhNc0gM"


def b62(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 62)
        digits = DIGITS[digit] + digits
        if not number:
            return digits


@pytest.mark.parametrize("token", [PLAIN, COMPRESSED])
def test_the_time_django_signed_at(token: bytes) -> None:
    assert signed_at(token) == 1796561039.0


@given(seconds=st.integers(0, 62**7 - 1), payload=st.binary(max_size=40), signature=st.text())
def test_any_signing_time_reads_back(seconds: int, payload: bytes, signature: str) -> None:
    token = payload + f":{b62(seconds)}:{signature.replace(':', '')}".encode()
    assert signed_at(token) == float(seconds)


@pytest.mark.parametrize(
    "token",
    [b"", b"no separators", b"a:b", b"payload::signature", b"p:1x-a:s", b"p:12345678:s"],
)
def test_a_token_without_a_signing_time_is_named(token: bytes) -> None:
    with pytest.raises(ItemError) as raised:
        signed_at(token)
    assert exception_reason(raised.value) == "time_missing"
