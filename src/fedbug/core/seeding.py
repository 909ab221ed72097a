"""Randomness by address: every draw comes from a generator seeded by (seed, purpose, ...).

The order in which clients run, the executor and a resume from a checkpoint then cannot change
any number: client i in round r always sees the same stream.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(seed: int, *address: int | str) -> int:
    """A 63-bit seed for ``(seed, *address)``, stable across processes and Python versions."""
    text = "/".join([str(int(seed)), *(str(a) for a in address)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def torch_generator(seed: int, *address: int | str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *address))
    return g


def numpy_rng(seed: int, *address: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *address))
