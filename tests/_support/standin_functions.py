"""Stand-ins for the functions of P2PFaaS's experiments, deployed by the compatibility tests.

``fn_pigo`` plays P2PFaaS's face detector ``fn-pigo``: CPU work proportional to the image's
size (about 1 ms per kB: the experiments' 320p blob takes ~28 ms, the 100p one ~16 ms) and a
small JSON answer. It only needs to behave like a CPU-bound function whose cost grows with its
input, which is what the benchmark client's payload mix and deadlines are about.
"""

from __future__ import annotations

import hashlib
import time

import orjson

MS_PER_KB = 1.0


def fn_pigo(payload: bytes) -> bytes:
    until = time.perf_counter() + len(payload) / 1024 * MS_PER_KB / 1000
    digest = hashlib.sha256(payload).digest()
    rounds = 0
    while time.perf_counter() < until:   # busy: a CPU-bound function, as face detection is
        digest = hashlib.sha256(digest).digest()
        rounds += 1
    return orjson.dumps({"faces": [], "bytes": len(payload), "rounds": rounds})


def shout(payload: bytes) -> bytes:
    return payload.upper()
