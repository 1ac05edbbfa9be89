"""A minimal OpenFaaS-style watchdog, standard library only (a function image needs just python3):
serves ``$P2PFAAS_HANDLER`` (default ``handler:handle``) on ``$port`` (default 8080), body in, body
out. ``GET /_/health`` answers 200 once the handler is loaded; a handler's ValueError is a 400,
anything else a 500."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("watchdog")
MAX_BODY = 8 * 1024 * 1024


def load(reference: str):
    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module), attr or "handle")


def make_server(handler, port: int, host: str = "") -> ThreadingHTTPServer:
    class Request(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: bytes, content_type: str = "application/octet-stream") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/_/health":
                self._answer(200, b"OK", "text/plain")
            else:
                self.do_POST()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, f"body over {MAX_BODY} bytes".encode(), "text/plain")
                return
            body = self.rfile.read(length) if length else b""
            try:
                output = handler(body)
            except ValueError as exc:
                self._answer(400, str(exc).encode(), "text/plain")
            except Exception as exc:  # the function's own failure, reported to the caller
                log.exception("handler failed")
                self._answer(500, f"{type(exc).__name__}: {exc}".encode(), "text/plain")
            else:
                self._answer(200, output if isinstance(output, bytes) else str(output).encode())

        def log_message(self, fmt: str, *args) -> None:  # quiet: one line per request is noise
            log.debug(fmt, *args)

    return ThreadingHTTPServer((host, port), Request)


def main() -> None:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"))
    sys.path.insert(0, os.getcwd())
    server = make_server(load(os.environ.get("P2PFAAS_HANDLER", "handler:handle")), int(os.environ.get("port", "8080")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"watchdog listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
