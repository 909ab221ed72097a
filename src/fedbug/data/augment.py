"""Training augmentation on whole batches of raw tensors, drawn from the client's generator.

``crop_flip`` is the CIFAR recipe (random crop after 4-pixel zero padding, horizontal flip with
probability 1/2), ``flip`` the Tiny-ImageNet one; both act on a uint8 (N, C, H, W) batch before
normalisation, so padding is with zeros of the raw image, as torchvision's RandomCrop does.

An augmentation is two halves: its draws (:meth:`Augmentation.draw`, on the host, from the
client's CPU generator, in the order one batch takes them) and their application to a batch on
whatever device holds it (:meth:`Augmentation.apply`: indexing and selection only, so the same
values on a CPU and a GPU). A GPU run augments where its samples are, the draws moved there
without a wait; the cohort executor draws each client's from its own generator and applies a
group's at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedbug.core.device import from_host
from fedbug.core.registry import Registry


class Augmentation:
    """``aug(x, gen)``: ``x`` augmented with draws from ``gen`` (a batch alone)."""

    def draw(self, n: int, gen: torch.Generator) -> Tensor:
        """The draws for a batch of ``n`` images, one int64 row an image, made on the host."""
        raise NotImplementedError

    def apply(self, x: Tensor, draws: Tensor) -> Tensor:
        """``x`` (N, C, H, W) augmented by ``draws`` (N rows of :meth:`draw`), on ``x``'s
        device (the draws moved there through pinned memory: no wait for the device)."""
        raise NotImplementedError

    def __call__(self, x: Tensor, gen: torch.Generator) -> Tensor:
        return self.apply(x, self.draw(len(x), gen))


class Flip(Augmentation):
    """Flip each image left-right with probability 1/2."""

    def draw(self, n: int, gen: torch.Generator) -> Tensor:
        return (torch.rand(n, generator=gen) < 0.5).long()[:, None]

    def apply(self, x: Tensor, draws: Tensor) -> Tensor:
        return flipped(x, from_host(draws[:, 0], x.device))


class CropFlip(Augmentation):
    """Zero-pad by ``padding`` and crop back to the original size at a random offset per image
    (the offsets drawn first, rows then columns), then :class:`Flip`."""

    def __init__(self, padding: int = 4) -> None:
        self.padding = padding

    def draw(self, n: int, gen: torch.Generator) -> Tensor:
        return torch.cat([crop_draws(n, gen, self.padding), Flip().draw(n, gen)], dim=1)

    def apply(self, x: Tensor, draws: Tensor) -> Tensor:
        d = from_host(draws, x.device)
        return flipped(cropped(x, d[:, 0], d[:, 1], self.padding), d[:, 2])


def crop_draws(n: int, gen: torch.Generator, padding: int) -> Tensor:
    """Each image's window offset, (rows, columns), in [0, 2 ``padding``]: the rows' for the
    batch first, then the columns'."""
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    return torch.stack([dy, dx], dim=1)


def cropped(x: Tensor, dy: Tensor, dx: Tensor, padding: int) -> Tensor:
    """Each image of ``x`` zero-padded by ``padding``, then its window at (``dy``, ``dx``): one
    gather from the view of every window (``unfold``), ~6x faster on a CPU core than indexing
    each pixel's row and column (500 CIFAR images: 4.2 against 26.9 ms)."""
    n, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    windows = padded.unfold(2, h, 1).unfold(3, w, 1)  # (n, c, offset y, offset x, h, w)
    return windows[torch.arange(n, device=x.device), :, dy, dx]


def flipped(x: Tensor, flip: Tensor) -> Tensor:
    """``x`` with the images where ``flip`` is 1 flipped left-right, along the last axis (a
    selection: no read of ``flip`` on the host)."""
    return torch.where(flip.bool().view(-1, *[1] * (x.dim() - 1)), x.flip(-1), x)


def hflip(x: Tensor, gen: torch.Generator) -> Tensor:
    """Flip each image left-right with probability 1/2."""
    return Flip()(x, gen)


def random_crop(x: Tensor, gen: torch.Generator, padding: int = 4) -> Tensor:
    """Zero-pad by ``padding`` and crop back to the original size at a random offset per image."""
    d = from_host(crop_draws(len(x), gen, padding), x.device)
    return cropped(x, d[:, 0], d[:, 1], padding)


AUGMENTATIONS: Registry[Augmentation | None] = Registry("augmentation")
AUGMENTATIONS.register("none")(None)
AUGMENTATIONS.register("flip")(Flip())
AUGMENTATIONS.register("crop_flip")(CropFlip())
