"""The functions real SAQ workers run in the tests."""

from __future__ import annotations

import asyncio
from typing import Any


async def succeed(ctx: dict[str, Any]) -> str:
    return "done"


async def fail(ctx: dict[str, Any]) -> None:
    raise RuntimeError("failing on purpose")


async def sleep_for(ctx: dict[str, Any], *, seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


FUNCTIONS = [succeed, fail, sleep_for]
