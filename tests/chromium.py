"""A real headless Chromium driven over the DevTools protocol, through a pipe (no extra library).

`--dump-dom` cannot show a page with JavaScript off (it reads the DOM with a script), so the
tests talk DevTools directly: Chromium reads commands on fd 3 and writes replies and events on
fd 4, each a JSON document ended by a NUL byte.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.tools import require


class Chromium:
    def __init__(self, profile: Path) -> None:
        commands_read, self._write = _high_pipe()
        self._read, replies_write = _high_pipe()
        browser = [
            require("chromium"),
            "--headless",
            "--no-sandbox",  # tests may run as root (CI containers)
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # bash moves the pipe ends to fds 3 and 4 and execs Chromium: no preexec_fn, which
        # is unsafe in a process with threads (the exporter under test runs in this one).
        moved = f"{shlex.join(browser)} 3<&{commands_read} 4>&{replies_write}"
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {moved}"],  # dash takes one-digit fds only
            pass_fds=(commands_read, replies_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        os.close(self._read)

    def page_dom(self, url: str, javascript: bool, settle: str | None = None) -> str:
        """The page's DOM after load (outer HTML), scripts off or on; with `settle`, after the
        DOM contains that text (what a script writes), or at the deadline."""
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self._call("Emulation.setScriptExecutionDisabled", session, value=not javascript)
        self._call("Page.enable", session)
        self._call("Page.navigate", session, url=url)
        self._wait_event("Page.loadEventFired", session)
        deadline = time.monotonic() + 20
        while True:
            root = self._call("DOM.getDocument", session, depth=-1)["root"]["nodeId"]
            dom: str = self._call("DOM.getOuterHTML", session, nodeId=root)["outerHTML"]
            if settle is None or settle in dom or time.monotonic() > deadline:
                return dom
            time.sleep(0.2)

    # -- the protocol ---------------------------------------------------------------------------

    def _send(self, method: str, session: str | None = None, **params: Any) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        wanted = self._send(method, session, **params)
        while True:
            message = self._receive()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result
            if "method" in message:
                self._events.append(message)

    def _wait_event(self, method: str, session: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for event in self._events:
                if event["method"] == method and event.get("sessionId") == session:
                    self._events.remove(event)
                    return
            message = self._receive()
            if "method" in message:
                self._events.append(message)
        raise TimeoutError(f"no {method} within 30 s")

    def _receive(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise OSError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        decoded: dict[str, Any] = json.loads(message)
        return decoded


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are above 10: moving them to 3 and 4 cannot overwrite each other."""
    ends = os.pipe()
    high = tuple(fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 10) for end in ends)
    for end in ends:
        os.close(end)
    return high[0], high[1]
