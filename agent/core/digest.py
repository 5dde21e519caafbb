"""SHA-256 hex digests without importing `hashlib`.

`hashlib` loads OpenSSL's libcrypto when it is imported (~3 ms, a few percent of a one-shot
simulated audit, which hashes only a few small files: the YAML cache keys, BMC message shapes).
CPython's built-in SHA-256 module gives the same digest and imports in a tenth of that time;
where an interpreter lacks it, `hashlib` is used after all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def _constructor() -> Callable[[bytes], Any]:
    try:
        if sys.version_info >= (3, 12):
            import _sha2 as builtin
        else:  # typeshed has no stub for 3.10 and 3.11's module
            import _sha256 as builtin  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # an interpreter built without its own hash modules
        import hashlib as builtin
    sha256: Callable[[bytes], Any] = builtin.sha256
    return sha256


_SHA256 = _constructor()


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of `data` as 64 lowercase hex digits (what `hashlib.sha256(data).hexdigest()` gives)."""
    return str(_SHA256(data).hexdigest())
