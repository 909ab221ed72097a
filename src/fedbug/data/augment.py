"""Training augmentation on whole batches of raw tensors, drawn from the client's generator.

``crop_flip`` is the CIFAR recipe (random crop after 4-pixel zero padding, horizontal flip with
probability 1/2), ``flip`` the Tiny-ImageNet one; both act on a uint8 (N, C, H, W) batch before
normalisation, so padding is with zeros of the raw image, as torchvision's RandomCrop does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedbug.core.registry import Registry

Augmentation = Callable[[Tensor, torch.Generator], Tensor]
AUGMENTATIONS: Registry[Augmentation | None] = Registry("augmentation")


def hflip(x: Tensor, gen: torch.Generator) -> Tensor:
    """Flip each image left-right with probability 1/2."""
    flip = torch.rand(x.shape[0], generator=gen) < 0.5
    if not bool(flip.any()):
        return x
    out = x.clone()
    out[flip] = x[flip].flip(-1)
    return out


def random_crop(x: Tensor, gen: torch.Generator, padding: int = 4) -> Tensor:
    """Zero-pad by ``padding`` and crop back to the original size at a random offset per image."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :]
    batch = torch.arange(n)[:, None, None, None]
    chans = torch.arange(x.shape[1])[None, :, None, None]
    return padded[batch, chans, rows, cols]


def crop_flip(x: Tensor, gen: torch.Generator) -> Tensor:
    return hflip(random_crop(x, gen), gen)


AUGMENTATIONS.register("none")(None)
AUGMENTATIONS.register("flip")(hflip)
AUGMENTATIONS.register("crop_flip")(crop_flip)
