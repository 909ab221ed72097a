"""``record_updates``' true inputs come from the client's own :class:`LocalRound` (replayed),
not from a second draw of its shuffle: under DP-SGD's Poisson batches (drawn from their own
generator, between the noise) they are the samples the client's steps drew; the attack's
``--known-order`` replays the shuffle by the client's own rule and refuses Poisson batches."""

from __future__ import annotations

import pytest
import torch

from fedbug.attack.unroll import known_batches
from fedbug.config import load_config
from fedbug.engine import client as client_module
from fedbug.engine.client import ShuffledBatches, first_drawn
from fedbug.errors import ConfigError
from fedbug.results.updates import load_update, recorded

TINY = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=2", "rounds=1"]
TINY += ["local_steps=3", "batch_size=4", "count_flops=false", "threads=1"]


def test_first_drawn_keeps_each_sample_once_in_the_order_first_drawn():
    steps = [torch.tensor([3, 1]), torch.tensor([1, 4]), torch.tensor([0, 3])]
    assert first_drawn(steps).tolist() == [3, 1, 4, 0]
    assert first_drawn([]).tolist() == []


def test_shuffled_batches_slice_one_permutation_an_epoch():
    """5 samples in batches of 2: 3 steps an epoch (the last of 1), a new draw each epoch."""
    gen = torch.Generator().manual_seed(0)
    draws = ShuffledBatches(5, 2, 3, gen)
    got = [draws.indices(k) for k in range(1, 7)]
    assert [len(i) for i in got] == [2, 2, 1, 2, 2, 1]
    ref = torch.Generator().manual_seed(0)
    first, second = torch.randperm(5, generator=ref), torch.randperm(5, generator=ref)
    assert torch.cat(got[:3]).tolist() == first.tolist()
    assert torch.cat(got[3:]).tolist() == second.tolist()


def test_under_dp_sgd_the_recorded_truth_is_what_the_poisson_batches_drew(tmp_path, monkeypatch):
    """Poisson batches (q = 4 / n) of 3 steps: the recorded inputs and labels are each sample
    the client's training steps drew, once, in the order drawn (was: the first 12 of a shuffle
    the client never drew, 0 or 1 of them trained on)."""
    pytest.importorskip("opacus")
    from fedbug.api import run

    trained: dict[int, list[torch.Tensor]] = {}
    batch_indices = client_module.LocalRound.batch_indices

    def spy(self, k):
        idx = batch_indices(self, k)
        if not self.keep_batches:  # the run's own training, not the recorder's replay
            trained.setdefault(self.task.client, []).append(idx.clone())
        return idx

    monkeypatch.setattr(client_module.LocalRound, "batch_indices", spy)
    for name in ("plot_run", "plot_partition"):
        monkeypatch.setattr(f"fedbug.engine.run_folder.{name}", lambda *a, **k: None)
    cfg = load_config(None, [*TINY, "record_updates=[1]", "dp_sgd.noise_multiplier=0.5"])
    folder = run(cfg, tmp_path / "run").run_dir
    from fedbug.engine.experiment import Experiment

    exp = Experiment(cfg)
    for client in recorded(folder)[1]:
        up = load_update(folder, 1, client)
        assert len(trained[client]) == 3
        idx = first_drawn(trained[client])
        data = exp.client_data(client)
        assert up.meta["num_images"] == len(idx) == len(up.labels)
        assert torch.equal(up.labels, data.y[idx])
        assert torch.equal(up.inputs, exp.dataset.prepare(data.x[idx]).float())


def test_the_known_order_refuses_poisson_batches_in_one_line():
    cfg = load_config(None, [*TINY, "dp_sgd.noise_multiplier=0.5"])
    meta = {"num_samples": 20, "client": 0, "round": 1, "lr": 0.1}
    with pytest.raises(ConfigError, match="--known-order .* dp_sgd.sampling: poisson"):
        known_batches(cfg, meta, 3, 5)
    shuffled = load_config(None, [*TINY, "dp_sgd.noise_multiplier=0.5", "dp_sgd.sampling=shuffle"])
    rows = known_batches(shuffled, meta, 3, 5)
    assert [len(r) for r in rows] == [4, 4, 4] and torch.cat(rows).tolist() == list(range(12))
