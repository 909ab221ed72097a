"""Batch augmentation: crop with padding and flips, by hand."""

import pytest
import torch

from fedbug.data.augment import AUGMENTATIONS, hflip, random_crop


def test_random_crop_is_a_shifted_window_of_the_padded_image():
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.uint8).view(2, 1, 6, 6)
    gen = torch.Generator().manual_seed(0)
    out = random_crop(x, gen, padding=2)
    assert out.shape == x.shape and out.dtype == x.dtype
    gen = torch.Generator().manual_seed(0)
    dy = torch.randint(0, 5, (2,), generator=gen)
    dx = torch.randint(0, 5, (2,), generator=gen)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):
        window = padded[i, :, dy[i] : dy[i] + 6, dx[i] : dx[i] + 6]
        assert torch.equal(out[i], window)


def test_flip_flips_about_half_and_only_left_right():
    x = torch.arange(400 * 3 * 4, dtype=torch.float32).view(400, 1, 3, 4)
    out = hflip(x, torch.Generator().manual_seed(1))
    flipped = [not torch.equal(out[i], x[i]) for i in range(400)]
    assert 150 < sum(flipped) < 250
    for i in range(400):
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(-1))


def test_registry_names():
    assert AUGMENTATIONS.get("none") is None
    assert set(AUGMENTATIONS.names()) == {"none", "flip", "crop_flip"}


def test_crop_flip_draws_the_offsets_then_the_flips_and_applies_them_in_that_order():
    """The sequence of draws a batch takes from its client's generator (rows' offsets, columns',
    then the flips), applied by hand: the window of the padded image, then flipped."""
    x = torch.arange(5 * 2 * 6 * 6, dtype=torch.uint8).view(5, 2, 6, 6)
    out = AUGMENTATIONS.get("crop_flip")(x, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    dy = torch.randint(0, 9, (5,), generator=gen)
    dx = torch.randint(0, 9, (5,), generator=gen)
    flip = torch.rand(5, generator=gen) < 0.5
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(5):
        window = padded[i, :, dy[i] : dy[i] + 6, dx[i] : dx[i] + 6]
        assert torch.equal(out[i], window.flip(-1) if flip[i] else window)


def test_a_groups_draws_applied_at_once_equal_each_batch_augmented_alone():
    """The cohort executor's way: each client's draws from its own generator, concatenated,
    applied to the group's batches in one call: each client's batch as augmented alone."""
    aug = AUGMENTATIONS.get("crop_flip")
    xs = [torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8) for _ in range(3)]
    alone = [aug(x, torch.Generator().manual_seed(c)) for c, x in enumerate(xs)]
    draws = torch.cat([aug.draw(4, torch.Generator().manual_seed(c)) for c in range(3)])
    together = aug.apply(torch.cat(xs), draws)
    assert torch.equal(together, torch.cat(alone))


def test_a_flip_flips_the_last_axis_of_samples_of_any_rank():
    """Grayscale images without a channel axis (N, H, W) flip as (N, 1, H, W) ones do."""
    x = torch.arange(6 * 3 * 4, dtype=torch.float32).view(6, 3, 4)
    out = AUGMENTATIONS.get("flip")(x, torch.Generator().manual_seed(2))
    ref = AUGMENTATIONS.get("flip")(x[:, None], torch.Generator().manual_seed(2))[:, 0]
    assert out.shape == x.shape and torch.equal(out, ref) and not torch.equal(out, x)


def _data(inputs, shape):
    from fedbug.data import FederatedDataset

    g = torch.Generator().manual_seed(0)
    x, xt = torch.rand(40, *shape, generator=g), torch.rand(10, *shape, generator=g)
    y, yt = torch.arange(40) % 2, torch.arange(10) % 2
    return FederatedDataset("mine", x, y, xt, yt, 2, inputs=inputs)


@pytest.mark.parametrize(
    "inputs, shape, augment, message",
    [
        ("vector", (6,), "flip", "data set 'mine' holds feature vectors; use augment: none"),
        ("image", (5, 5), "crop_flip", r"crops \(C, H, W\) images.*shaped \(5, 5\)"),
    ],
)
def test_an_augmentation_the_samples_cannot_take_is_refused(inputs, shape, augment, message):
    from tiny import user_data_config

    from fedbug.engine.experiment import Experiment
    from fedbug.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        Experiment(user_data_config(augment=augment), dataset=_data(inputs, shape))
