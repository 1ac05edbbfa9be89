"""Functions a node can run: a registry of bytes -> bytes callables and the built-ins."""

from functions.registry import (
    FunctionInputError,
    FunctionRegistry,
    FunctionSpec,
    default_registry,
    load_reference,
)
from functions.secrets import SecretNotGiven, secret

__all__ = ["FunctionInputError", "FunctionRegistry", "FunctionSpec", "SecretNotGiven", "default_registry",
           "load_reference", "secret"]
