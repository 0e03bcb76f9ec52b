"""The one file hash of the testbed: SHA-256 of a file's bytes, read in 1 MiB blocks.

Every place that records or checks a file's identity uses it: a model file of the zoo against its
manifest (:mod:`testbed.plan.zoo`), a plug-in's module (:mod:`testbed.core.plugins`), a selector's
module or Stable-Baselines3 file (:mod:`testbed.agent.selector`), a downloaded wheel
(``models/zoo_sources.py``). Bytes already in memory that are then used (a model file checked
as it is loaded, a member of a wheel) are hashed by :func:`bytes_sha256`, so that what is checked
is what is used.
"""

from __future__ import annotations

import hashlib
import os

#: The block size of a read (bytes).
BLOCK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 (64 hex digits) of the bytes of the file at ``path``.

    Raises:
        OSError: the file cannot be opened or read (FileNotFoundError when it does not exist).
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def bytes_sha256(data: bytes) -> str:
    """The SHA-256 (64 hex digits) of ``data``."""
    return hashlib.sha256(data).hexdigest()


__all__ = ["BLOCK_BYTES", "bytes_sha256", "file_sha256"]
