"""Image functions without an engine: references, registration, and the watchdog's HTTP contract."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from broker.embedded import free_port
from functions.image import ImageFunction, parse_image_reference
from functions.registry import IMAGE_TIMEOUT_S, default_registry
from functions.watchdog import make_server


@pytest.mark.parametrize("reference, image", [
    ("image:p2pfaas-fn-wordcount", "p2pfaas-fn-wordcount"),
    ("image:ghcr.io/acme/resize:1.2", "ghcr.io/acme/resize:1.2"),
    ("image:repo/fn@sha256:" + "a" * 64, "repo/fn@sha256:" + "a" * 64),
    ("functions.builtins:echo", None),
])
def test_image_references(reference, image):
    assert parse_image_reference(reference) == image


@pytest.mark.parametrize("bad", ["image:", "image:Upper/Case", "image:a b", "image:-leading"])
def test_malformed_image_reference_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="must look like"):
        parse_image_reference(bad)


def test_registry_takes_image_functions_lazily():
    registry = default_registry([("wc", "image:p2pfaas-fn-wordcount:latest")])  # no engine needed yet
    spec = registry.get("wc")
    assert isinstance(spec.body, ImageFunction) and spec.body.image == "p2pfaas-fn-wordcount:latest"
    assert spec.timeout_s >= IMAGE_TIMEOUT_S   # the first call includes the container's cold start


@pytest.fixture
def watchdog():
    def handler(body: bytes) -> bytes:
        if body == b"bad":
            raise ValueError("bad input")
        if body == b"boom":
            raise RuntimeError("exploded")
        return body[::-1]

    server = make_server(handler, free_port(), "127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_watchdog_body_in_body_out_and_errors(watchdog):
    assert post(watchdog + "/", b"abc") == (200, b"cba")
    assert post(watchdog + "/anything", b"") == (200, b"")
    assert post(watchdog, b"bad") == (400, b"bad input")
    status, body = post(watchdog, b"boom")
    assert status == 500 and b"RuntimeError: exploded" in body
    with urllib.request.urlopen(watchdog + "/_/health", timeout=5) as answer:
        assert answer.status == 200
