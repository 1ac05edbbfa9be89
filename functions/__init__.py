"""Functions a node can run: a registry of bytes -> bytes callables and the built-ins."""

from functions.registry import FunctionRegistry, default_registry, load_reference
from functions.secrets import SecretNotGiven, secret
from functions.spec import FunctionInputError, FunctionSpec

__all__ = ["FunctionInputError", "FunctionRegistry", "FunctionSpec", "SecretNotGiven", "default_registry",
           "load_reference", "secret"]
