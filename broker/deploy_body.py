"""A function's deployment as OpenFaaS users write it (deploy body, faas-cli ``stack.yml``) read into a
:class:`~broker.messages.FunctionDeployment`; what is not done here is refused with its reason."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from broker.messages import FunctionDeployment

IMAGE = "image:"
SCALE = "com.openfaas.scale."
NOT_SUPPORTED = {"requests": "resource requests are not supported: every node runs every function",
                 "constraints": "placement constraints are not supported: every node runs every function"}
IGNORED = {"namespace", "registryAuth", "network"}   # nothing to do here: no namespaces, no registry
KNOWN = {"service", "name", "image", "reference", "envProcess", "envVars", "labels", "annotations", "secrets",
         "limits", "readOnlyRootFilesystem", "timeout", "concurrency", "scaling", *NOT_SUPPORTED, *IGNORED}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T|k)?\s*$")
_MEMORY_UNITS = {None: 1, "k": 1000, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
                 "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class DeployBodyError(ValueError):
    """What is wrong with a deploy body, in words for its sender."""


def memory_bytes(text: Any) -> int:
    """Kubernetes' quantities as OpenFaaS takes them: ``128Mi``, ``1G``, ``134217728``."""
    found = _MEMORY.match(str(text))
    if not found:
        raise DeployBodyError(f"memory {text!r} must look like 128Mi, 1Gi or a number of bytes")
    return int(float(found.group(1)) * _MEMORY_UNITS[found.group(2)])


def cpus(text: Any) -> float:
    """``500m`` (millicores), ``0.5`` or ``2``."""
    value = str(text).strip()
    try:
        return float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    except ValueError:
        raise DeployBodyError(f"cpu {text!r} must look like 500m, 0.5 or 2") from None


def duration_s(text: Any) -> float:
    """Go's durations as the watchdog and OpenFaaS's labels write them (``15m``, ``500ms``), or seconds."""
    found = _DURATION.match(str(text))
    if not found:
        raise DeployBodyError(f"duration {text!r} must look like 30s, 15m, 500ms or a number of seconds")
    return float(found.group(1)) * _DURATION_UNITS[found.group(2)]


def _strings(sent: dict, key: str) -> dict[str, str]:
    value = sent.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise DeployBodyError(f"{key} must be an object of strings")
    return {str(k): v for k, v in value.items()}


def _scaling(sent: dict, labels: dict[str, str]) -> dict | None:
    """p2pfaas's ``scaling`` object, or OpenFaaS's scaling labels read into one."""
    scaling = sent.get("scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise DeployBodyError("scaling must be an object {min, max, zero_after_s, policy}")
    ours = dict(scaling or {})
    if not any(k.startswith(SCALE) for k in labels) and "p2pfaas.scale.policy" not in labels:
        return ours or None
    try:
        if SCALE + "min" in labels:
            ours.setdefault("min", int(labels[SCALE + "min"]))
        if SCALE + "max" in labels:
            ours.setdefault("max", int(labels[SCALE + "max"]))
    except ValueError:
        raise DeployBodyError(f"{SCALE}min and {SCALE}max must be whole numbers") from None
    if labels.get(SCALE + "zero", "").lower() == "true":
        ours.setdefault("min", 0)
        if SCALE + "zero-duration" in labels:
            ours.setdefault("zero_after_s", duration_s(labels[SCALE + "zero-duration"]))
    if "p2pfaas.scale.policy" in labels:
        ours.setdefault("policy", labels["p2pfaas.scale.policy"])
    return ours


def deployment_fields(sent: Any) -> dict[str, Any]:
    """The FunctionDeployment fields of an OpenFaaS (or P2PFaaS-wrapped) deploy body, or DeployBodyError."""
    if isinstance(sent, dict) and isinstance(sent.get("openfaas_service"), dict):
        sent = sent["openfaas_service"]
    if not isinstance(sent, dict):
        raise DeployBodyError("the function must be a JSON object {service, image} or {service, reference}")
    service = sent.get("service") or sent.get("name")
    image = sent.get("image")
    reference = sent.get("reference") or (IMAGE + image if isinstance(image, str) else None)
    if not isinstance(service, str) or not isinstance(reference, str):
        raise DeployBodyError("a function needs service and image (an image) or reference (module:callable)")
    asked = [f"{key}: {why}" for key, why in NOT_SUPPORTED.items() if sent.get(key)]
    if sent.get("readOnlyRootFilesystem"):
        asked.append("readOnlyRootFilesystem: not supported for image functions yet")
    unknown = sorted(set(sent) - KNOWN)
    if asked or unknown:
        raise DeployBodyError("; ".join([*asked, *(f"{key}: unknown" for key in unknown)]))
    env, labels = _strings(sent, "envVars"), _strings(sent, "labels")
    fields: dict[str, Any] = {"service": service, "reference": reference, "env_vars": env, "labels": labels,
                              "annotations": _strings(sent, "annotations")}
    process = sent.get("envProcess")
    if process:   # OpenFaaS: the process the image's watchdog runs (its fprocess)
        if not isinstance(process, str) or not reference.startswith(IMAGE):
            raise DeployBodyError("envProcess is the process an image's watchdog runs: give it with image")
        fields["env_vars"] = {**env, "fprocess": process}
    secrets = sent.get("secrets") or []
    if not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets):
        raise DeployBodyError("secrets must be a list of secret names")
    fields["secrets"] = secrets
    limits = sent.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"memory", "cpu"}:
        raise DeployBodyError("limits must be an object {memory, cpu} (e.g. {\"memory\": \"256Mi\", \"cpu\": \"0.5\"})")
    if any(limits.values()):
        fields["limits"] = {"memory_bytes": memory_bytes(limits["memory"]) if limits.get("memory") else None,
                            "cpus": cpus(limits["cpu"]) if limits.get("cpu") else None}
    timeout = sent.get("timeout", env.get("exec_timeout"))
    if timeout:
        fields["timeout_s"] = duration_s(timeout)
    concurrency = sent.get("concurrency", env.get("max_inflight"))
    if concurrency and str(concurrency) != "0":   # of-watchdog's max_inflight 0: no limit
        try:
            fields["concurrency"] = int(concurrency)
        except ValueError:
            raise DeployBodyError(f"concurrency {concurrency!r} must be a whole number") from None
    scaling = _scaling(sent, labels)
    if scaling is not None:
        fields["scaling"] = scaling
    return fields


def read_deployment(sent: Any) -> FunctionDeployment:
    """The deployment of a deploy body, checked whole; DeployBodyError with every reason otherwise."""
    fields = deployment_fields(sent)
    try:
        return FunctionDeployment.model_validate(fields)
    except ValidationError as exc:
        raise DeployBodyError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                                        for e in exc.errors())) from None
