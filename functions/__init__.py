"""Functions a node can run: a registry of bytes -> bytes callables and the built-ins."""

from functions.registry import (
    FunctionInputError,
    FunctionRegistry,
    FunctionSpec,
    default_registry,
    load_reference,
)

__all__ = ["FunctionInputError", "FunctionRegistry", "FunctionSpec", "default_registry", "load_reference"]
