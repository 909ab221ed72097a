"""Mean and spread over seeds, and how tables show them.

One seed has no spread: tables show its figure alone, never "± 0.00", which would claim that
repeated seeds agreed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def mean_std(xs: list[float]) -> tuple[float, float]:
    """The mean and sample standard deviation of ``xs`` (std 0.0 for one value, NaN for none)."""
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def pm(
    mean: float, std: float, n: int, fmt: str = ".2f", scale: float = 1.0, std_fmt: str = ""
) -> str:
    """``mean ± std`` over ``n`` values, multiplied by ``scale`` and formatted with ``fmt``
    (the std with ``std_fmt`` if given, and never with a sign); the mean alone when ``n`` is
    1, as one value has no spread; "-" when there is none (every seed left out)."""
    if n == 0:
        return "-"
    text = f"{scale * mean:{fmt}}"
    return text if n < 2 else f"{text} ± {scale * std:{(std_fmt or fmt).replace('+', '')}}"


def row_pm(
    row: dict[str, Any], key: str, fmt: str = ".2f", scale: float = 1.0, std_fmt: str = ""
) -> str:
    """:func:`pm` of a summary row's ``{key}_mean``, ``{key}_std`` and ``{key}_n`` (the number
    of seeds with a value; rows without it: every seed of ``row["seeds"]``)."""
    n = row.get(f"{key}_n", len(row["seeds"]))
    return pm(row[f"{key}_mean"], row[f"{key}_std"], n, fmt, scale, std_fmt)
