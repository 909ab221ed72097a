"""The cohort executor's host work around its gradient: a group step's batches read from the
chunk's samples in one gather (:class:`Samples`), and the group's gradient made flat in one
concatenation (:meth:`CohortExecutor.flatten`); hand-checked against a client's own rows and
the parameters' own gradients."""

from types import SimpleNamespace

import pytest
import torch
from test_cohort import UNEQUAL_EPOCH, assert_close_to_sequential
from tiny import tiny_config

from fedbug.engine.client import Draws, to_channels_last
from fedbug.engine.executors import build_executor, cohort
from fedbug.engine.executors.cohort import Rows, Samples, like_rows
from fedbug.engine.experiment import Experiment

CPU = torch.device("cpu")


def opened(client, xs, ys):
    """What :meth:`Samples.adopt` reads of a client's opened round."""
    return SimpleNamespace(xs=xs, ys=ys, task=SimpleNamespace(client=client))


def chunk_of(xs_list, prepared=True):
    samples = Samples([len(x) for x in xs_list], prepared)
    rounds = []
    for c, xs in enumerate(xs_list):
        rounds.append(opened(c, xs, torch.arange(len(xs)) + 100 * c))
        mine = rounds[-1].xs
        samples.adopt(c, rounds[-1])
        assert torch.equal(rounds[-1].xs, mine) and rounds[-1].xs.stride() == mine.stride()
    return samples, rounds


@pytest.mark.parametrize("channels", [3, 1])
def test_a_groups_batches_are_its_clients_own_rows_stacked_in_their_layout(channels):
    """Clients of 5, 3 and 4 NHWC samples (one channel: the strides the library gives a
    one-channel batch); groups of consecutive and of scattered rows read each client's own
    rows, each in the layout of the client's own batch (a stack would lose a one-channel
    batch's)."""
    g = torch.Generator().manual_seed(0)
    xs = [to_channels_last(torch.randn(n, channels, 4, 4, generator=g)) for n in (5, 3, 4)]
    samples, rounds = chunk_of(xs)
    for clients, idx in (([0, 1], [[4, 0], [2, 1]]), ([2, 0], [[3, 3], [1, 0]])):
        at = [torch.tensor(i) for i in idx]
        drawn = [Draws(i, None) for i in at]
        x, y = samples.batches(Rows.of(clients, CPU), drawn, SimpleNamespace(augment=None))
        own = [rounds[c].xs[i] for c, i in zip(clients, at)]
        assert torch.equal(x, torch.stack(own))
        assert all(x[k].stride() == b.stride() for k, b in enumerate(own))  # a client's layout
        assert y.tolist() == [[100 * c + i for i in row] for c, row in zip(clients, idx)]


def test_samples_not_prepared_are_prepared_a_group_at_once():
    """Raw bytes (a chunk whose clients do not all prepare once): the group's batch is
    prepared once, with the numbers and layout of each client's batch prepared alone."""
    xs = [torch.randint(0, 256, (n, 3, 2, 2), dtype=torch.uint8) for n in (4, 6)]
    samples, rounds = chunk_of(xs, prepared=False)
    rt = SimpleNamespace(prepare=lambda b: to_channels_last(b.float() / 255 - 0.5), augment=None)
    at = [torch.tensor([3, 1]), torch.tensor([0, 5])]
    x, _ = samples.batches(Rows.of([0, 1], CPU), [Draws(i, None) for i in at], rt)
    own = [rt.prepare(rounds[c].xs[i]) for c, i in enumerate(at)]
    assert torch.equal(x, torch.stack(own))
    assert all(x[k].stride() == b.stride() for k, b in enumerate(own))


def test_a_client_whose_count_is_wrong_is_refused():
    samples = Samples([2, 3], prepared=True)
    with pytest.raises(RuntimeError, match="client 7: 4 samples, counted 2"):
        samples.adopt(0, opened(7, torch.zeros(4, 1), torch.zeros(4)))


def test_the_flat_gradient_puts_each_parameter_at_its_offset_and_zero_elsewhere():
    """Parameters a (entries 0-1) and c (entry 5) of a 7-entry vector with a gap between (3-4)
    and after: the gradients of a and c at their places, zero in the gap, the frozen b and the
    tail."""
    ex = build_executor(Experiment(tiny_config(executor="cohort", threads=1)), None)
    ex.params = [("a", 0, 2, (2,), 0), ("b", 2, 1, (1,), 1), ("c", 5, 1, (1,), 2)]
    ex.space = SimpleNamespace(total=7)
    g = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "c": torch.tensor([[5.0], [6.0]])}
    assert ex.flatten(g, 2).tolist() == [[1, 2, 0, 0, 0, 5, 0], [3, 4, 0, 0, 0, 6, 0]]
    assert ex.flatten({"c": g["c"]}, 2).tolist() == [[0, 0, 0, 0, 0, 5, 0], [0, 0, 0, 0, 0, 6, 0]]
    assert ex.flatten({"b": torch.tensor([[7.0]])}, 1).tolist() == [[0, 0, 7, 0, 0, 0, 0]]


def test_a_chunk_whose_clients_do_not_all_prepare_once_prepares_none(monkeypatch):
    """Unequal clients with the prepared-samples cap between their sizes: alone, the small
    ones would prepare once and the large ones batch by batch; in a chunk all are prepared a
    group at a time (the same elementwise numbers): the sequential executor's results."""
    cfg = tiny_config(**{**UNEQUAL_EPOCH, "local_epochs": 2})
    sizes = sorted(Experiment(cfg).sizes)
    cap = sizes[len(sizes) // 2] * 64 * 4  # the MLP's 64 float32 features a digit
    monkeypatch.setattr("fedbug.engine.client.PREPARED_BYTES", cap)
    seen = []
    batches = Samples.batches

    def spy(self, *args):
        seen.append(self.prepared)
        return batches(self, *args)

    monkeypatch.setattr(cohort.Samples, "batches", spy)
    assert_close_to_sequential(cfg)
    assert seen and not any(seen)


def test_scattered_rows_of_a_padded_view_are_copied_in_its_layout():
    """Rows 3 and 1 of a 4 x 6 view of 8-wide rows: copied with their padding (row stride 8),
    the same values; a view whose last row's padding would lie past its storage (columns 2-6
    of the same rows) is copied plainly."""
    from fedbug.engine.executors.cohort import gather_rows

    base = torch.arange(32.0).view(4, 8)
    rows = torch.tensor([3, 1])
    wide = gather_rows(base[:, :6], rows)
    assert wide.stride() == (8, 1) and wide.tolist() == base[[3, 1], :6].tolist()
    inner = gather_rows(base[:, 2:], rows)
    assert inner.stride() == (6, 1) and inner.tolist() == base[[3, 1], 2:].tolist()


def test_rows_like_a_strided_sample_do_not_overlap():
    """A client of one sample whose rows are a strided view (every other column) gets rows
    laid out contiguously, not its view's strides (on which the chunk's rows would overlap);
    dense rows keep their layout, NHWC included, whatever the number of samples."""
    big = torch.arange(2 * 3 * 4 * 8, dtype=torch.float32).reshape(2, 3, 4, 8)
    one = big[:1, :, :, ::2]
    rows = like_rows(one, 3)
    for r in range(3):
        rows[r].copy_(one[0] + r)
    assert all(torch.equal(rows[r], one[0] + r) for r in range(3))
    nhwc = to_channels_last(big)
    assert like_rows(nhwc[:1], 3).stride() == nhwc.stride()
    assert like_rows(nhwc, 3).stride() == nhwc.stride()
    assert like_rows(big[:, :, :, ::2], 3).is_contiguous()
