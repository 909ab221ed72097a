"""``core.finite``: a finite sum answers at once; an overflowed one and non-finite entries are
read entry by entry, so the answer is ``torch.isfinite``'s in every case."""

import pytest
import torch
from tiny import TwoLayer, runtime

from fedbug.core import finite
from fedbug.core.finite import all_finite, non_finite_count
from fedbug.engine.checks import check_update
from fedbug.engine.client import ClientResult

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("values", "dtype", "bad"),
    [
        ([1.0, -2.0, 3.5], torch.float32, 0),
        ([3e38, 3e38, -1.0], torch.float32, 0),  # the sum overflows; every entry is finite
        ([6e4, 6e4], torch.float16, 0),  # 120,000: past float16's largest, not float32's
        ([1.0, NAN, 2.0], torch.float32, 1),
        ([INF, -INF, 0.0], torch.float32, 2),  # the sum is NaN
        ([INF, 5.0], torch.bfloat16, 1),
        ([NAN, INF, 1.0], torch.float64, 2),
        ([], torch.float32, 0),
        ([1.0, NAN], torch.complex64, 1),
        ([1.0, 2.0], torch.complex64, 0),
    ],
)
def test_answers_as_isfinite(values: list[float], dtype: torch.dtype, bad: int) -> None:
    t = torch.tensor(values, dtype=dtype)
    assert non_finite_count(t) == int((~torch.isfinite(t)).sum()) == bad
    assert all_finite(t) is (bad == 0)


def test_integers_and_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all_finite(torch.arange(5))
    monkeypatch.setattr(finite, "BLOCK", 4)  # entry by entry in blocks of 4: the last one bad
    t = torch.full((3, 5), 3e38)
    assert all_finite(t)
    t[2, 4] = NAN
    assert not all_finite(t) and non_finite_count(t) == 1
    assert not all_finite(t[:, ::2])  # a strided view is read too


def test_an_update_of_large_finite_entries_is_aggregated_and_a_bad_one_counted() -> None:
    space = runtime(TwoLayer()).space
    delta = torch.full((space.total,), 3e38)  # sums past float32's largest
    trained = [True] * space.num_units
    res = ClientResult(client=0, num_samples=5, delta=delta, trained=trained, state={})
    assert check_update(res, space) is None
    delta[:2] = torch.tensor([INF, -INF])
    reason = check_update(res, space)
    assert reason is not None and f"(2 of {space.total} update entries" in reason
