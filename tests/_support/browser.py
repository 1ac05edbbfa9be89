"""A real headless Chromium driven over the Chrome DevTools Protocol: just enough to open a page,
evaluate JavaScript, click, and take a screenshot (``async with Chromium(tmp) as page``).

Debian's ``chromium`` package (``.ci/run`` installs it); ``P2PFAAS_CHROMIUM`` names another binary.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect as ws_connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0")
DEVTOOLS_RE = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium_path() -> str | None:
    return os.environ.get("P2PFAAS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(Exception):
    """The browser did not start, or a DevTools command failed."""


class Chromium:
    """One browser with one tab; ``errors`` collects the page's uncaught exceptions and console errors."""

    def __init__(self, profile_dir: Path, *, width: int = 1440, height: int = 1000, start_timeout_s: float = 30.0) -> None:
        self.profile_dir, self.width, self.height = profile_dir, width, height
        self.start_timeout_s = start_timeout_s
        self.errors: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._ws = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._session = ""
        self._loaded = asyncio.Event()

    async def __aenter__(self) -> "Chromium":
        binary = chromium_path()
        if binary is None:
            raise BrowserError("chromium is not installed: apt-get install -y chromium (.ci/run does this)")
        self._proc = await asyncio.create_subprocess_exec(
            binary, *FLAGS, f"--user-data-dir={self.profile_dir}", f"--window-size={self.width},{self.height}",
            "about:blank", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            url = await asyncio.wait_for(self._devtools_url(), self.start_timeout_s)
            self._ws = await ws_connect(url, max_size=64 * 1024 * 1024)
            self._reader = asyncio.create_task(self._read())
            target = await self.send("Target.createTarget", url="about:blank")
            attached = await self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
            self._session = attached["sessionId"]
            for method in ("Page.enable", "Runtime.enable"):
                await self.send(method)
            await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                            deviceScaleFactor=1, mobile=False)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self.send("Browser.close", session=False, timeout_s=5)
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()

    async def _devtools_url(self) -> str:
        assert self._proc is not None and self._proc.stderr is not None
        seen = b""
        while line := await self._proc.stderr.readline():
            seen += line
            if match := DEVTOOLS_RE.search(line):
                # keep draining stderr, or a chatty browser blocks on a full pipe
                asyncio.get_running_loop().create_task(self._proc.stderr.read())
                return match.group(1).decode()
        raise BrowserError(f"chromium exited before DevTools listened:\n{seen.decode(errors='replace')[-2000:]}")

    async def _read(self) -> None:
        async for raw in self._ws:
            message = orjson.loads(raw)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            else:
                self._on_event(message.get("method", ""), message.get("params", {}))

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))

    async def send(self, method: str, *, session: bool = True, timeout_s: float = 30.0, **params: Any) -> dict:
        request_id = next(self._ids)
        message: dict[str, Any] = {"id": request_id, "method": method, "params": params}
        if session and self._session:
            message["sessionId"] = self._session
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        await self._ws.send(orjson.dumps(message).decode())
        answer = await asyncio.wait_for(future, timeout_s)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    # -- what a test does with a page ----------------------------------------------------------
    async def open(self, url: str, timeout_s: float = 30.0) -> None:
        self._loaded.clear()
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        await asyncio.wait_for(self._loaded.wait(), timeout_s)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited); BrowserError if it threw."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 20.0, interval_s: float = 0.1) -> Any:
        """Evaluate until the value is truthy; AssertionError with the expression after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not (value := await self.evaluate(expression)):
            if loop.time() > deadline:
                raise AssertionError(f"page condition not met within {timeout_s} s: {expression}")
            await asyncio.sleep(interval_s)
        return value

    async def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": size["height"], "scale": 1})
        data = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(data["data"]))
        return path
