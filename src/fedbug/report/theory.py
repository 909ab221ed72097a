"""Measured client-discrepancy contraction of FedAvg vs FedBug (paper Section 4, Appendix B).

Client i holds x_i = e_i, y_i = 1; the model is f(x) = x.n + v with weights n = [n_1..n_m] and
bias v. Every number here comes from actually running the updates: gradient descent on each
client's loss, then the server's plain mean. The closed forms are only printed beside them.

Loss convention: we run GD on L_i = 1/2 (n_i + v - 1)^2. The paper writes |n_i + v - 1|^2 but its
stage-one update, n_i - eta (n_i + v - 1) (proof of Theorem 2), is a gradient step on the 1/2
form, so eta means exactly the paper's eta. Both forms have the same minimisers.

m-client derivation (Appendix B, Definition R.1: d = sum_{j != k} |n_j - n_k|). Local GD moves
n_i and v by the same amount, so n_i - v is invariant and client i converges to
n_i* = (1 + n_i - v) / 2, leaving n_k (k != i) unchanged. FedBug first takes k frozen-bias steps,
giving n_i - v -> (1 - eta)^k n_i + const. Averaging over m clients, every n_j becomes
c n_j + const with c = (2m - 2 + (1 - eta)^k) / (2m) (FedAvg: (1 - eta)^k replaced by 1), so
every pairwise gap, hence d, shrinks by c. For k = 1: FedAvg (2m-1)/(2m), FedBug (2m-1-eta)/(2m);
m = 2 recovers Theorems 1 (3/4) and 2 ((3-eta)/4). Checked by measurement in tests/test_theory.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedbug.errors import ConfigError

Method = Literal["fedavg", "fedbug"]
TOL = 1e-13  # local convergence: max |n_i + v - 1| over clients
MAX_LOCAL_STEPS = 100_000
D_FLOOR = 1e-4  # the 1e-13 local tolerance shifts a ratio by ~1e-13/d, so stop below this
#: Sizes the analysis takes: each client's copy is a row of an m x m matrix (and the discrepancy
#: an m x m difference), so m = 1000 is 8 MB and about 0.25 s a round on a laptop core; 1000
#: rounds of that are four minutes, and a report computes every (clients, eta) pair twice.
MAX_CLIENTS = 1000
MAX_ROUNDS = 1000
#: values one list of ``theory_report`` (``--eta``, ``--clients``) may hold
MAX_VALUES = 100


@dataclass(frozen=True)
class RatioResult:
    """Measured contraction ratio r = d^{i+1} / d^i (Definition 2) and its closed form."""

    method: str
    clients: int
    eta: float
    ratios: tuple[float, ...]  # one per measured global round
    measured: float  # mean of ``ratios``
    max_deviation: float  # max |ratio - predicted| over the rounds
    predicted: float


def _out_of_range(name: str, value: object, fix: str) -> ConfigError:
    return ConfigError(f"{name}={value} is out of range; {fix}.")


def _check_sizes(eta: float, clients: int, rounds: int) -> None:
    if not 0.0 < eta < 1.0:
        raise _out_of_range("eta", eta, "Theorem 2 needs 0 < eta < 1")
    if clients < 2:
        raise _out_of_range("clients", clients, "use at least 2 clients")
    if clients > MAX_CLIENTS:
        raise _out_of_range(
            "clients",
            clients,
            f"use at most {MAX_CLIENTS} clients (the analysis holds m x m arrays)",
        )
    if rounds < 1:
        raise _out_of_range("rounds", rounds, "use at least 1 round")
    if rounds > MAX_ROUNDS:
        raise _out_of_range("rounds", rounds, f"use at most {MAX_ROUNDS} rounds")


def _check(eta: float, clients: int, rounds: int, local_lr: float, unfreeze_steps: int) -> None:
    _check_sizes(eta, clients, rounds)
    if not 0.0 < local_lr < 1.0:
        raise ConfigError(
            f"local_lr={local_lr} is out of range; local GD is stable for 0 < lr < 1."
        )
    if unfreeze_steps < 1:
        raise ConfigError(f"unfreeze_steps={unfreeze_steps} is out of range; use at least 1.")


def predicted_ratio(method: Method, eta: float, clients: int = 2, unfreeze_steps: int = 1) -> float:
    """Closed form (2m - 2 + (1-eta)^k) / (2m); FedAvg uses 1 for (1-eta)^k (Theorems 1, 2)."""
    shrink = 1.0 if method == "fedavg" else (1.0 - eta) ** unfreeze_steps
    return (2 * clients - 2 + shrink) / (2 * clients)


def discrepancy(n: np.ndarray) -> float:
    """Client discrepancy d = sum_{j != k} |n_j - n_k| (Appendix B, Def. R.1).

    For two clients this is 2|a - b|, twice Definition 1, which leaves the ratio unchanged.
    """
    return float(np.abs(n[:, None] - n[None, :]).sum())


def run_round(
    method: Method,
    n: np.ndarray,
    v: float,
    eta: float,
    local_lr: float = 0.1,
    unfreeze_steps: int = 1,
) -> tuple[np.ndarray, float]:
    """One global round (Section 4.2): every client trains from (n, v); the server averages.

    Client i's copy is row i of ``N`` (all m weights) plus ``V[i]``; its gradient on
    L_i = 1/2 (x_i.n + v - 1)^2 is (r_i x_i, r_i). FedBug first takes ``unfreeze_steps`` steps of
    size ``eta`` on the weights only (bias frozen), then both methods run GD with ``local_lr`` on
    all parameters until local convergence.
    """
    m = n.shape[0]
    X = np.eye(m)  # row i is client i's input x_i = e_i
    N = np.tile(np.asarray(n, dtype=np.float64), (m, 1))
    V = np.full(m, float(v))

    def residual() -> np.ndarray:
        return (N * X).sum(axis=1) + V - 1.0

    if method == "fedbug":
        for _ in range(unfreeze_steps):
            N -= eta * residual()[:, None] * X
    for _ in range(MAX_LOCAL_STEPS):
        r = residual()
        if np.abs(r).max() < TOL:
            break
        N -= local_lr * r[:, None] * X
        V -= local_lr * r
    else:
        raise ConfigError(f"local_lr={local_lr} did not converge in {MAX_LOCAL_STEPS} steps.")
    return N.mean(axis=0), float(V.mean())


def contraction_ratio(
    method: Method,
    eta: float,
    clients: int = 2,
    rounds: int = 5,
    seed: int = 0,
    local_lr: float = 0.1,
    unfreeze_steps: int = 1,
) -> RatioResult:
    """Measure r = d^{i+1}/d^i (Definition 2) over ``rounds`` rounds from a seeded random start.

    Theorem 1 (FedAvg, r = 3/4), Theorem 2 (FedBug, r = (3-eta)/4), Appendix B for m clients.
    Stops early once d < 1e-4: the 1e-13 local-convergence tolerance shifts a ratio by ~1e-13/d.
    """
    if method not in ("fedavg", "fedbug"):
        raise ConfigError(f"method={method!r} is unknown; use 'fedavg' or 'fedbug'.")
    _check(eta, clients, rounds, local_lr, unfreeze_steps)
    rng = np.random.default_rng(seed)
    n = rng.uniform(-1.0, 1.0, clients)  # distinct almost surely, so d > 0 (non-degenerate)
    v = float(rng.uniform(-1.0, 1.0))
    ratios: list[float] = []
    d = discrepancy(n)
    for _ in range(rounds):
        n, v = run_round(method, n, v, eta, local_lr, unfreeze_steps)
        d_next = discrepancy(n)
        ratios.append(d_next / d)
        d = d_next
        if d < D_FLOOR:
            break
    pred = predicted_ratio(method, eta, clients, unfreeze_steps)
    arr = np.array(ratios)
    return RatioResult(
        method=method,
        clients=clients,
        eta=eta,
        ratios=tuple(float(x) for x in arr),
        measured=float(arr.mean()),
        max_deviation=float(np.abs(arr - pred).max()),
        predicted=pred,
    )


def theory_report(
    etas: Sequence[float] = (0.1, 0.5, 0.9),
    clients: Sequence[int] = (2, 3, 5, 10),
    rounds: int = 5,
    seed: int = 0,
) -> dict:
    """Measured vs predicted ratios (JSON-serialisable): two clients (Section 4.3) and m clients.
    Every value is checked before anything is computed."""
    for name, flag, values in (("etas", "eta", etas), ("clients", "clients", clients)):
        if not 1 <= len(values) <= MAX_VALUES:
            raise ConfigError(
                f"{name} holds {len(values)} values (--{flag}); give 1 to {MAX_VALUES}."
            )
    for m in clients:
        for eta in etas:
            _check_sizes(eta, m, rounds)

    def row(m: int, eta: float) -> dict:
        avg = contraction_ratio("fedavg", eta, m, rounds, seed)
        bug = contraction_ratio("fedbug", eta, m, rounds, seed)
        return {
            "eta": float(eta),
            "fedavg_measured": avg.measured,
            "fedavg_predicted": avg.predicted,
            "fedbug_measured": bug.measured,
            "fedbug_predicted": bug.predicted,
        }

    return {
        "two_client": [row(2, eta) for eta in etas],
        "m_client": [{"clients": int(m), **row(m, eta)} for m in clients for eta in etas],
    }


def format_theory_report(report: dict) -> str:
    """Plain-text tables of ``theory_report``'s output (measured beside predicted)."""
    cols = ["fedavg_measured", "fedavg_predicted", "fedbug_measured", "fedbug_predicted"]
    lines: list[str] = []
    for title, key, lead in (
        ("Two clients (Theorems 1, 2): r = 3/4 and (3-eta)/4", "two_client", []),
        ("m clients (Appendix B): r = (2m-1)/(2m) and (2m-1-eta)/(2m)", "m_client", ["clients"]),
    ):
        head = [*lead, "eta", *cols]
        lines += [title, "  ".join(f"{h:>16}" for h in head)]
        for r in report.get(key, []):
            cells = [f"{r[h]:>16}" for h in lead] + [f"{r['eta']:>16g}"]
            lines.append("  ".join(cells + [f"{r[c]:>16.12f}" for c in cols]))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
