"""The end-of-epoch policy hook: roll units back to the received weights, or restart."""

import torch
from handcalc import W0
from tiny import TwoLayer, data, runtime, set_weights, task

from fedbug.engine.client import EpochAction, TrainSettings, train_client
from fedbug.policies import FreezePolicy, PolicySession, StepCtx


class RollbackFirst(FreezePolicy):
    """Trains everything in epoch 1, then puts unit 0 back and freezes it."""

    def __init__(self, restart: bool = False) -> None:
        super().__init__()
        self.restart = restart
        self.calls: list = []

    def trainable_units(self, ctx: StepCtx):
        return range(ctx.num_units)

    def start_client(self, task):
        return _RollbackFirstClient(self, task)


class _RollbackFirstClient(PolicySession):
    def __init__(self, policy, task) -> None:
        super().__init__(policy, task)
        self.frozen: set = set()

    def trainable_units(self, ctx: StepCtx):
        return tuple(u for u in range(ctx.num_units) if u not in self.frozen)

    def end_of_epoch(self, ctx):
        self.policy.calls.append((ctx.epoch, ctx.epochs))
        if ctx.epoch == 1 and not self.frozen:
            self.frozen.add(0)
            return EpochAction(restart=True) if self.policy.restart else EpochAction(restore=(0,))
        return None

    def finish(self, result):
        result.figures["n_frozen"] = len(self.frozen)


def _run(policy):
    m = TwoLayer()
    set_weights(m, W0)
    settings = TrainSettings(local_epochs=3, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(m, settings=settings)
    rt.policy = policy
    xs, ys = [[1.0, 2.0], [0.5, -1.0]], [0, 1]
    return train_client(torch.tensor(W0), task(), data(xs, ys), {}, rt)


def test_rollback_restores_and_freezes_the_unit_and_it_is_not_uploaded():
    policy = RollbackFirst()
    res = _run(policy)
    assert torch.equal(res.delta[:6], torch.zeros(6))
    assert res.delta[6:].abs().sum() > 0
    assert res.trained == [False, True] and res.uploaded == [False, True]
    assert res.figures["n_frozen"] == 1 and res.bytes_up == 4 * 6
    assert policy.calls == [(1, 3), (2, 3)]


def test_restart_runs_all_epochs_again_with_the_unit_frozen():
    policy = RollbackFirst(restart=True)
    res = _run(policy)
    assert torch.equal(res.delta[:6], torch.zeros(6))
    assert res.probe_steps == 2 and res.steps == 6
    assert policy.calls == [(1, 3), (1, 3), (2, 3)]
