"""The function registry and the built-ins (pure: bytes in, bytes out)."""

from __future__ import annotations

import pytest

from functions import FunctionInputError, default_registry, load_reference
from functions.registry import parse_function_specs


@pytest.fixture
def registry():
    return default_registry()


def test_builtins(registry):
    assert {"echo", "fib", "sleep", "busy", "montecarlo-pi"} <= set(registry.names())
    assert registry.get("echo").body(b"\x00hi") == b"\x00hi"
    assert registry.get("fib").body(b"25") == b"75025"
    assert registry.get("sleep").body(b"0.01").startswith(b"slept 0.01")
    assert registry.get("busy").body(b"5").startswith(b"busy 5 ms")
    assert abs(float(registry.get("montecarlo-pi").body(b"20000")) - 3.14159) < 0.05


@pytest.mark.parametrize("fn, payload", [("fib", b"abc"), ("fib", b"99"), ("sleep", b"-1"), ("busy", b"\xff")])
def test_bad_inputs_raise_input_errors(registry, fn, payload):
    with pytest.raises(FunctionInputError):
        registry.get(fn).body(payload)


def test_user_functions_by_reference():
    registry = default_registry("up=functions.builtins:echo")
    assert registry.get("up").body(b"x") == b"x"
    assert parse_function_specs("a=m:f, b=n.o:g") == [("a", "m:f"), ("b", "n.o:g")]


@pytest.mark.parametrize("ref, fragment", [("nomodule", "must look like"), ("no_such_mod_xyz:f", "cannot import"),
                                           ("functions.builtins:SPECS", "not a callable")])
def test_bad_references(ref, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_reference(ref)
