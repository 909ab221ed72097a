"""``fedbug attack RUN_FOLDER``: reconstruct a client's inputs from its recorded update and
score the reconstruction; the results go to ``RUN_FOLDER/attack/round-R-client-K-METHOD/``
(``scores.json``, ``grid.png``)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.attack.counts import check_counts, check_unrolled
from fedbug.attack.inversion import INITS, Observation, dlg, idlg_labels, inverting_gradients
from fedbug.attack.replay import (
    NOT_FROM_CONFIG,
    REPLAY_TOL,
    Finding,
    algorithm_findings,
    attack_mode,
    clipped_findings,
    config_findings,
    replay_error,
    replay_finding,
)
from fedbug.attack.scoring import image_scores, label_recovery, match_order, save_grid
from fedbug.attack.unroll import attacked_parts, trainer, unroll_of
from fedbug.errors import ConfigError
from fedbug.results.files import atomic_write_bytes, check_no_links, open_write
from fedbug.results.updates import (
    RecordedUpdate,
    load_update,
    load_weights,
    recorded,
    round_dir,
    tensors_limit,
)

METHODS = ("auto", "dlg", "idlg", "ig", "ig-unrolled")
DEFAULT_ITERATIONS = {"dlg": 300, "idlg": 300, "ig": 2000, "ig-unrolled": 2000}


def pick(run: Path, round: int | None, client: int | None) -> tuple[int, int]:
    """The round and client to attack (first recorded where not given); one-line refusals."""
    have = recorded(run)
    if not have:
        raise ConfigError(
            f"{run} recorded no updates; rerun it with record_updates: [round, ...] to attack one"
        )
    r = min(have) if round is None else round
    if r not in have:
        raise ConfigError(f"--round {r}: not recorded in {run} (recorded: {sorted(have)})")
    k = have[r][0] if client is None else client
    if k not in have[r]:
        raise ConfigError(f"--client {k}: not recorded in round {r} (recorded: {have[r]})")
    return r, k


def observation(up: RecordedUpdate, model: nn.Module, unrolled: bool = False) -> Observation:
    """The update as a gradient: ``-delta / lr - weight_decay * w`` per sent parameter that
    moved (the server knows the recipe: the decay of the received weights taken out; exact for
    one SGD step, and for several a scaled gradient, which the cosine distance does not see);
    ``unrolled``: ``-delta`` itself (a release's over ``global_lr``), to match the replayed
    local steps' (the caller sets its ``unroll``: :func:`fedbug.attack.unroll.unroll_of`)."""
    meta = up.meta
    lr, wd = float(meta["lr"]), float(meta.get("weight_decay", 0.0))
    params = dict(model.named_parameters())
    # a sent parameter that did not move at all was frozen (or had no gradient): the server
    # can tell, so it is left out of the match rather than matched to zero
    moved = {k: d for k, d in up.deltas.items() if bool(d.any())}
    if unrolled:  # a release's delta is global_lr times the client's (lr: its product)
        scale = trainer(meta)[2] / lr
        target = {k: -d * scale for k, d in moved.items()}
    else:
        target = {k: -d / lr - wd * params[k].detach() for k, d in moved.items()}
    if not target:
        raise ConfigError(f"client {meta['client']}'s recorded update is all zeros: nothing leaks")
    shape = tuple(meta["input_shape"])
    return Observation(model, target, shape, int(meta["num_images"]), int(meta["num_classes"]))


def build_attacked_model(up: RecordedUpdate, cfg: Any) -> nn.Module:
    """The round's received model: the run's model as the run built it from its config
    ``cfg`` (its options, the algorithm's wrap: :func:`~fedbug.attack.unroll.attacked_parts`,
    which the unrolled replay's schedule comes from too), with the received weights."""
    from fedbug.models import is_hf

    meta = up.meta
    if is_hf(str(meta["model"])):  # token inputs: nothing to invert by gradient on pixels
        raise ConfigError(
            f"fedbug attack inverts images and vectors; the run recorded a Hugging Face model "
            f"({meta['model']}) on token sequences, which it does not attack"
        )
    model = attacked_parts(cfg, meta)[1].template
    names = meta["received_names"]
    state = model.state_dict()
    _check_names(up, state, dict(model.named_parameters()))
    for name, (off, n) in names.items():
        state[name] = up.received[off : off + n].view(state[name].shape).to(state[name].dtype)
    model.load_state_dict(state)
    model.eval()
    return model


def _check_names(up: RecordedUpdate, state: dict[str, Tensor], params: dict[str, Tensor]) -> None:
    """Refuse, in one line, a recorded update whose names do not fit the model it names: a
    received weight not in the model or of another size, or past the received vector; a delta
    of a parameter the model lacks or of another shape."""
    size = up.received.numel()
    for name, (off, n) in up.meta["received_names"].items():
        if name not in state or state[name].numel() != n or off + n > size:
            raise ConfigError(
                f"recorded update of client {up.meta['client']}: received_names' {name!r} "
                f"[{off}, {n}] does not fit model {up.meta['model']!r} and the {size} received "
                "weights; record the round again"
            )
    for name, d in up.deltas.items():
        if name not in params or params[name].shape != d.shape:
            raise ConfigError(
                f"recorded update of client {up.meta['client']}: delta.{name} "
                f"{tuple(d.shape)} is no parameter of model {up.meta['model']!r}; record the "
                "round again"
            )


def choose_method(method: str, obs: Observation, steps: int, clients: int = 1) -> str:
    """``auto``: iDLG for one image and one step, DLG for one step, else Inverting Gradients
    with the client's local steps unrolled (the paper's multi-step attack), or matched as one
    gradient where the update averages ``clients`` clients' (a release of several)."""
    if method != "auto":
        return method
    if steps == 1:
        return "idlg" if obs.num_images == 1 and idlg_labels(obs) is not None else "dlg"
    return "ig-unrolled" if clients == 1 else "ig"


def reconstruct(
    obs: Observation,
    method: str,
    iterations: int,
    seed: int,
    init: str = "normal",
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Tensor, Tensor, bool]:
    """(inputs, labels, whether the labels came from iDLG's rule); ``init``: the dummy inputs'
    start (:data:`fedbug.attack.inversion.INITS`); ``progress(i, loss)`` each iteration."""
    labels = idlg_labels(obs) if method in ("idlg", "ig", "ig-unrolled") else None
    if method == "idlg" and labels is None:
        raise ConfigError(
            "--method idlg needs a one-image update whose classifier was sent; use --method dlg"
        )
    if method in ("ig", "ig-unrolled"):
        x, y = inverting_gradients(
            obs, iterations=iterations, seed=seed, labels=labels, init=init, progress=progress
        )
    else:
        x, y = dlg(
            obs, iterations=iterations, seed=seed, labels=labels, init=init, progress=progress
        )
    return x, y, labels is not None


def unrolled(
    cfg: Any, up: RecordedUpdate, model: nn.Module, known_order: bool = False
) -> tuple[Observation, float | None, list[Finding]]:
    """The observation for ``ig-unrolled``: ``-delta`` with the client's local steps
    (:func:`~fedbug.attack.unroll.unroll_of`); the replay error of the recorded inputs in their
    first epoch's order (None: no truth recorded), and the findings. A release that averages
    several clients is refused: their steps are not one client's."""
    clients = int(up.meta.get("clients", 1))
    if clients > 1:
        raise ConfigError(
            f"--method ig-unrolled replays one client's local steps, and this release averages "
            f"{clients} clients' updates; use --method ig"
        )
    obs = observation(up, model, unrolled=True)
    unroll, found = unroll_of(cfg, up, obs, known_order)
    obs.unroll = unroll
    err = None
    if up.inputs is not None and up.labels is not None:
        err = replay_error(obs, up.inputs, up.labels)
        why = NOT_FROM_CONFIG
        if unroll.batches is None and len(unroll.trained) > unroll.per_epoch:
            why = (
                "the client reshuffled its later epochs, replayed here in the first's order "
                "(its shuffle is unknown); --known-order replays its own (an upper bound)"
            )
        found += replay_finding(err, "the replay of the recorded inputs' steps", why)
    return obs, err, found


def meta_file(run: Path, round: int, client: int) -> Path:
    """A recorded update's JSON side (``updates/round-R/client-K.json``)."""
    return round_dir(run, round) / f"client-{int(client)}.json"


def checked_update(run: Path, r: int, k: int, cfg: Any) -> RecordedUpdate:
    """Client ``k``'s recorded update of round ``r``, its numbers checked against the run's
    config ``cfg`` (:func:`~fedbug.attack.counts.check_counts`) before anything is built."""
    up = load_update(run, r, k)
    check_counts(cfg, up.meta, meta_file(run, r, k))
    return up


def run_config(run: Path) -> Any:
    """The run's own config (``config.yaml``), validated."""
    from fedbug.config import load_config

    return load_config(run / "config.yaml")


def released_update(run: Path, r: int, cfg: Any) -> tuple[RecordedUpdate, list[Finding]]:
    """Round ``r``'s released update as one client's: the global weights after the round
    (round ``r + 1``'s received ones) minus round ``r``'s, over the parameters some client
    sent, at step ``lr x global_lr``; the truth is every recorded client's inputs of the
    round. Under ``dp:`` this is the clipped, noised aggregate anyone after the server sees."""
    nxt = round_dir(run, r + 1) / "global.pt"
    if not nxt.is_file():
        raise ConfigError(
            f"--released: round {r + 1}'s received weights are not recorded; rerun with "
            f"record_updates: [{r}, {r + 1}]"
        )
    ups = [checked_update(run, r, k, cfg) for k in recorded(run)[r]]
    first = ups[0]
    delta = load_weights(run, nxt, tensors_limit(first.meta)) - first.received
    offsets, shapes = first.meta["received_names"], {}
    for up in ups:
        shapes.update({k: v.shape for k, v in up.deltas.items()})
    if unnamed := sorted(set(shapes) - set(offsets)):
        raise ConfigError(
            f"--released: round {r}'s recorded updates send {unnamed[0]!r}, which client "
            f"{first.meta['client']}'s received_names lacks; record the round again"
        )
    deltas = {k: delta[offsets[k][0] : offsets[k][0] + offsets[k][1]].view(shp)
              for k, shp in shapes.items()}  # fmt: skip
    truth = [(u.inputs, u.labels) for u in ups if u.inputs is not None and u.labels is not None]
    whole = len(truth) == len(ups)  # the truth of every client, or none
    inputs = torch.cat([x for x, _ in truth]) if whole else None
    labels = torch.cat([y for _, y in truth]) if whole else None
    meta = {**first.meta, "client": "released", "lr": float(first.meta["lr"]) * cfg.global_lr,
            "client_lr": float(first.meta["lr"]), "clients": len(ups),
            "first_client": first.meta["client"],
            "num_images": sum(int(u.meta["num_images"]) for u in ups),
            "steps": max(int(u.meta["steps"]) for u in ups),
            "units_sent": sorted({x for u in ups for x in u.meta["units_sent"]})}  # fmt: skip
    found = []
    if len(ups) > 1:
        found.append(Finding("warn", "--released", f"the release averages {len(ups)} clients' "
                             "updates, attacked as one batch of all their inputs (exact for "
                             "one step, equal weights and no clip)"))  # fmt: skip
    return RecordedUpdate(deltas, first.received, meta, inputs, labels), found


def check_replay(
    cfg: Any, up: RecordedUpdate, obs: Observation, model_found: list[Finding], chosen: str,
    released: bool,
) -> tuple[list[Finding], float | None]:  # fmt: skip
    """Every :mod:`~fedbug.attack.replay` finding, and the one-step replay error (None where
    the update is of several steps or no truth was recorded)."""
    steps = int(up.meta["steps"])
    found = model_found + algorithm_findings(cfg) + config_findings(cfg, up.meta, chosen, released)
    found += clipped_findings(cfg, obs, chosen, steps)
    err = None
    if steps == 1 and up.inputs is not None and up.labels is not None:
        err = replay_error(obs, up.inputs, up.labels)
        found = downgrade(found, err) + replay_finding(err)
    return found, err


def downgrade(found: list[Finding], err: float) -> list[Finding]:
    """A one-step update whose recorded inputs give its gradient (error within
    :data:`REPLAY_TOL`) replays exactly whatever the config suggests (FedProx's term is zero at
    the received weights; no transform drawn): its refusals become warnings."""
    if err > REPLAY_TOL:
        return found
    note = f" (this step replayed exactly: error {err:.1g})"
    return [Finding("warn", f.key, f.line + note) if f.kind == "refuse" else f for f in found]


def refuse(found: list[Finding], allow_inexact: bool) -> None:
    """The first refusal as one line (exit 2 on the command line) unless ``allow_inexact``."""
    bad = [f for f in found if f.kind == "refuse"]
    if bad and not allow_inexact:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConfigError(f"cannot replay this update exactly: {bad[0]}{more}")


def attack(
    run: Path | str,
    round: int | None = None,
    client: int | None = None,
    method: str = "auto",
    iterations: int | None = None,
    seed: int = 0,
    init: str = "normal",
    released: bool = False,
    allow_inexact: bool = False,
    say: Callable[[str], None] | None = None,
    known_order: bool = False,
) -> dict[str, Any]:
    """Attack one recorded update (``released``: the round's released update, the aggregate);
    returns the scores (also written with the grid). ``init``: ``normal`` (DLG's and Inverting
    Gradients' code) or ``uniform`` (iDLG's code, Fling's). What the attack cannot replay
    exactly (:mod:`fedbug.attack.replay`) is refused unless ``allow_inexact``; every finding is
    in the scores' ``inexact``. ``known_order`` gives ``ig-unrolled`` the client's shuffle (an
    upper bound: :func:`fedbug.attack.unroll.known_batches`). ``say`` is told each finding
    before the attack starts and its progress (every twentieth of the iterations), which also
    goes to ``attack.log`` in the attack's folder."""
    run = Path(run)
    if method not in METHODS:
        raise ConfigError(f"--method {method}: choose one of {', '.join(METHODS)}")
    if init not in INITS:
        raise ConfigError(f"--init {init}: choose one of {', '.join(INITS)}")
    r, k = pick(run, round, client)
    cfg = run_config(run)
    up, found = released_update(run, r, cfg) if released else (checked_update(run, r, k, cfg), [])
    model = build_attacked_model(up, cfg)
    found += attack_mode(model)
    obs = observation(up, model)
    steps = int(up.meta["steps"])
    chosen = choose_method(method, obs, steps, int(up.meta.get("clients", 1)))
    more, err = check_replay(cfg, up, obs, found, chosen, released)
    unrolled_err = None
    if known_order and chosen != "ig-unrolled":
        raise ConfigError(
            f"--known-order replays the client's steps in its own order, and --method {chosen} "
            "replays none; use --method ig-unrolled (auto takes it for several local steps)"
        )
    if chosen == "ig-unrolled":
        check_unrolled(cfg, up.meta, meta_file(run, r, up.meta.get("first_client", k)))
        obs, unrolled_err, found_unrolled = unrolled(cfg, up, model, known_order)
        more += found_unrolled
    refuse(more, allow_inexact)
    its = iterations or DEFAULT_ITERATIONS[chosen]
    who = "released" if released else f"client-{k}"
    name = f"round-{r}-{who}-{chosen}" + ("-known-order" if known_order else "")
    log = Progress(attack_folder(run, name) / "attack.log", its, say)
    for f in more:
        log.say(f"{f.kind}: {f}")
    x, y, from_rule = reconstruct(obs, chosen, its, seed, init, log.step)
    out = {
        "round": r,
        "client": "released" if released else k,
        "method": chosen,
        "iterations": its,
        "seed": seed,
        "init": init,
        "local_steps": steps,
        "num_images": obs.num_images,
        "units_sent": up.meta["units_sent"],
        "labels_from_idlg_rule": from_rule,
        "replay_error": err,
        "unrolled_replay_error": unrolled_err,
        "known_order": known_order,
        "inexact": [f"{f.kind}: {f}" for f in more],
    }
    return score(run, name, up, x, y, out)


def attack_folder(run: Path, name: str) -> Path:
    """``run/attack/name``, made, never through a link."""
    folder = run / "attack" / name
    check_no_links(run, folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Progress:
    """An attack's findings and progress: each line to ``say`` (the terminal) and ``path``,
    a new file (a former attack's log removed; never written through a link)."""

    def __init__(self, path: Path, iterations: int, say: Callable[[str], None] | None) -> None:
        self.path, self.iterations, self.tell = path, iterations, say
        self.every = max(1, iterations // 20)
        self.start = time.perf_counter()
        check_no_links(path.parent, path)
        path.unlink(missing_ok=True)
        open_write(path).close()

    def say(self, line: str) -> None:
        with open_write(self.path, append=True) as f:
            f.write(line + "\n")
        if self.tell is not None:
            self.tell(line)

    def step(self, i: int, loss: float) -> None:
        if (i + 1) % self.every == 0 or i + 1 == self.iterations:
            took = time.perf_counter() - self.start
            self.say(f"iteration {i + 1}/{self.iterations}, loss {loss:.4g}, {took:.0f} s")


def score(
    run: Path,
    name: str,
    up: RecordedUpdate,
    x: Tensor,
    y: Tensor,
    head: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``head`` (what was attacked, how) with PSNR/SSIM (per image, each true image paired with
    its nearest distinct reconstruction, and their mean), label recovery; written with the grid
    under ``attack/``."""
    folder = attack_folder(run, name)
    out: dict[str, Any] = {**(head or {}), "folder": str(folder)}
    if up.inputs is None or up.labels is None:
        out["scored"] = False
    else:
        true = up.inputs.reshape(-1, *up.meta["input_shape"]).to(torch.float32)
        found = x.reshape(true.shape)
        if not bool(torch.isfinite(found).all()):  # the optimisation diverged: scored as zeros
            out["diverged"] = True
            found = torch.nan_to_num(found, nan=0.0, posinf=0.0, neginf=0.0)
        found = found[match_order(true, found)]
        per = image_scores(true, found) if true.dim() == 4 else []
        out.update(
            scored=True,
            label_recovery=label_recovery(up.labels, y),
            per_image=per,
            psnr=sum(p["psnr"] for p in per) / max(1, len(per)),
            ssim=sum(p["ssim"] for p in per) / max(1, len(per)),
        )
        if true.dim() == 4:
            buf = io.BytesIO()
            save_grid(true, found, buf)
            atomic_write_bytes(folder / "grid.png", buf.getvalue())
    atomic_write_bytes(folder / "scores.json", (json.dumps(out, indent=1) + "\n").encode())
    return out
