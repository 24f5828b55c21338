"""Where a test's threads are now: a marker for "the others have arrived", instead of a sleep
that is long enough on a quiet host only."""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any


def waits_at(thread: threading.Thread, function: Callable[..., Any], line: str) -> bool:
    """True when `thread` is within `function` (a plain function or method), at the first line
    of its source that holds `line` (e.g. a lock's `with`: blocked acquiring it)."""
    code = inspect.unwrap(function).__code__
    lines, first = inspect.getsourcelines(code)
    wanted = first + next(index for index, text in enumerate(lines) if line in text)
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_lineno == wanted
        frame = frame.f_back
    return False
