"""A headless Chromium page driven over the DevTools protocol, for tests.

It talks CDP over a websocket with websocket-client (installed for the kubernetes client):
console messages, exceptions and network requests arrive as events from the first load on,
page geometry comes from ``Runtime.evaluate`` and the screenshot from the same page. Every
wait has a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import websocket

TIMEOUT_S = 30.0


class HeadlessChromium:
    def __init__(self, profile: Path, *, width: int, height: int) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            raise RuntimeError("chromium is not installed (`make browser` installs it)")
        self.proc = subprocess.Popen(
            [
                binary, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.events: list[dict] = []
        self._next_id = 0
        try:
            self._ws = websocket.create_connection(
                self._page_websocket(), timeout=TIMEOUT_S, suppress_origin=True
            )
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self._set_viewport(width, height)
        except BaseException:
            self.close()
            raise

    def _set_viewport(self, width: int, height: int) -> None:
        """The page lays out at ``width`` x ``height`` CSS pixels, one device pixel each."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _page_websocket(self) -> str:
        """The page's DevTools address; the port is the one Chromium reports choosing."""
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(x) for x in self.proc.stderr], daemon=True
        ).start()
        deadline = time.monotonic() + TIMEOUT_S
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            match = re.search(r"DevTools listening on ws://([^/]+)/", line)
            if match:
                with urllib.request.urlopen(f"http://{match[1]}/json/list", timeout=10) as f:
                    targets = json.load(f)
                return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        raise RuntimeError(f"chromium did not start its DevTools server:\n{''.join(seen)[-2000:]}")

    def call(self, method: str, **params) -> dict:
        """Sends one command and returns its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            message = json.loads(self._ws.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)
        raise TimeoutError(f"{method}: no answer in {TIMEOUT_S} s")

    def wait_for_event(self, method: str, *, since: int = 0) -> dict:
        """The first ``method`` event from ``self.events[since]`` on."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            for event in self.events[since:]:
                if event.get("method") == method:
                    return event
            self.events.append(json.loads(self._ws.recv()))
        raise TimeoutError(f"no {method} in {TIMEOUT_S} s")

    def load(self, url: str) -> None:
        since = len(self.events)
        self.call("Page.navigate", url=url)
        self.wait_for_event("Page.loadEventFired", since=since)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression evaluated in the page (None for
        undefined)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, *, width: int, height: int) -> bytes:
        """A PNG of the page's top ``width`` x ``height`` CSS pixels, at one pixel each."""
        self._set_viewport(width, height)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        return base64.b64decode(data)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries, as text."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(f"console.{params['type']}: {params['args']}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']}")
        return found

    def requests(self) -> list[str]:
        """The URLs the page requested."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def pixels_of(image: np.ndarray, region: dict, color: str) -> int:
    """Pixels of ``color`` (a CSS ``rgb(r, g, b)``) inside ``region`` (a DOMRect's x, y,
    width and height; one CSS pixel per image pixel), within a small margin."""
    rgb = np.array([int(c) for c in color[color.index("(") + 1 : color.index(")")].split(",")[:3]])
    top, left = int(region["y"]), int(region["x"])
    box = image[top : top + int(region["height"]), left : left + int(region["width"])]
    return int((np.abs(box - rgb).max(axis=-1) <= 8).sum())
