"""Policies compose by intersecting their trainable sets; a set need not be contiguous."""

import torch
from tiny import data, runtime, task
from torch import nn

from fedbug.engine.client import TrainSettings, train_client
from fedbug.policies import BottomUp, StepCtx, TopDown
from fedbug.policies.base import FreezePolicy, Intersection


class Fixed(FreezePolicy):
    def __init__(self, units: tuple[int, ...]) -> None:
        super().__init__()
        self.units = units

    def trainable_units(self, ctx: StepCtx) -> tuple[int, ...]:
        return self.units


def test_intersection_of_ranges_and_sets():
    ctx = StepCtx(step=3, local_steps=10, num_units=5)
    both = Intersection((BottomUp(0.5), TopDown(0.5)))
    assert both.trainable_units(ctx) == (2,)
    assert Intersection((Fixed((0, 2, 4)), BottomUp(0.5))).trainable_units(ctx) == (0, 2)


class ThreeLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.c = nn.Linear(2, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_non_contiguous_units_train_and_the_gap_stays_bitwise_unchanged():
    torch.manual_seed(0)
    m = ThreeLayer()
    settings = TrainSettings(local_steps=3, batch_size=1, weight_decay=0.1, count_flops=False)
    rt = runtime(m, "fedprox", params={"mu": 1.0}, settings=settings)
    rt.policy = Fixed((0, 2))
    w0 = rt.space.flatten(m)
    res = train_client(w0, task(), data([[1.0, 2.0]], [1]), {}, rt)
    mid = rt.space.unit_slices[1]
    assert torch.equal(res.delta[mid], torch.zeros(6))
    assert res.delta[rt.space.unit_slices[0]].abs().sum() > 0
    assert res.delta[rt.space.unit_slices[2]].abs().sum() > 0
    assert res.trained == [True, False, True]
    assert res.bytes_up == 4 * 12
