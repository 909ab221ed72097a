"""The on-disk client-state store: round trip, exact resume, initial state for a client
never written; FedDyn's running sum of all clients' lambda against their full mean."""

from pathlib import Path

import pytest
import torch
from tiny import tiny_config, without_timing

import fedbug.engine.rounds as engine
from fedbug.engine import Experiment, run_experiment, state_store
from fedbug.engine.state_store import StateStore
from fedbug.engine.states import ClientStates
from fedbug.results import RunDir


def _state(v: float) -> dict[str, torch.Tensor]:
    return {"lambda": torch.full((6,), v), "local.1": torch.arange(4.0).view(2, 2) + v}


def test_round_trip_and_never_written_client_reads_initial_state(tmp_path):
    exp = Experiment(tiny_config(algorithm="feddyn"))
    states = ClientStates(exp.algorithm, exp.space, tmp_path / "cs", exp.num_clients)
    lam = torch.randn(exp.space.total)
    states.put(2, {"lambda": lam})
    assert states.store is not None and states.states == {}  # on disk, not in memory
    assert torch.equal(states.get(2)["lambda"], lam)
    fresh = states.get(4)  # never written: the algorithm's initial state
    assert set(fresh) == {"lambda"} and torch.equal(fresh["lambda"], torch.zeros_like(lam))
    assert list(states.store.written()) == [2]
    states.put(2, {"lambda": lam + 1})  # overwrite before any checkpoint
    assert torch.equal(states.get(2)["lambda"], lam + 1)


def test_resume_forgets_writes_after_the_checkpoint(tmp_path):
    store = StateStore.create(tmp_path, 5, _state(0.0))
    store.put(0, _state(1.0))
    store.put(1, _state(2.0))
    gen = store.commit()  # a checkpoint
    store.put(0, _state(3.0))  # after it: twice for client 0, once for 1 and 3
    store.put(0, _state(4.0))
    store.put(1, _state(5.0))
    store.put(3, _state(6.0))
    assert store.get(0)["lambda"][0] == 4.0
    store.close()
    back = StateStore.open(tmp_path, gen)  # the run is killed and resumed from the checkpoint
    for client, v in ((0, 1.0), (1, 2.0)):
        got = back.get(client)
        assert torch.equal(got["lambda"], _state(v)["lambda"])
        assert torch.equal(got["local.1"], _state(v)["local.1"])
    assert back.get(3) is None and back.get(4) is None
    back.put(0, _state(7.0))  # writing on after the resume keeps the checkpoint's version
    gen2 = back.commit()
    back.put(0, _state(8.0))
    back.close()
    assert StateStore.open(tmp_path, gen2).get(0)["lambda"][0] == 7.0
    assert not back.accepts({"lambda": torch.zeros(6)})


def test_engine_resume_with_the_store_equals_uninterrupted(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "STATE_STORE_MIN_BYTES", 0)  # store even this tiny model
    cfg = tiny_config(algorithm="feddyn", rounds=5, checkpoint_every=2, num_clients=6)
    full = run_experiment(cfg, tmp_path / "full")
    assert (tmp_path / "full" / "client_states" / "data.f32").exists()
    ck = RunDir(tmp_path / "full").load_checkpoint()
    assert set(ck["client_states"]) == {"__store__"}  # the checkpoint holds no state itself
    run_experiment(cfg, tmp_path / "cut", stop_after=3)  # killed after round 3 (ckpt at 2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)
    memory = run_experiment(cfg.model_copy(update={"name": "mem"}))  # no run folder: in memory
    assert torch.equal(memory.weights, full.weights)


def test_feddyn_running_sum_equals_full_mean_after_many_rounds(tmp_path, monkeypatch):
    """The server's lambda_sum, updated from the participants only, against the mean of all N
    clients' lambda_i (those never selected still at zero), to 1e-6."""
    monkeypatch.setattr(engine, "STATE_STORE_MIN_BYTES", 0)
    cfg = tiny_config(
        algorithm="feddyn", rounds=30, local_steps=2, num_clients=12, clients_per_round=3,
        eval_every=30, checkpoint_every=30, count_flops=False, threads=1,
    )  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    ck = RunDir(tmp_path / "run").load_checkpoint()
    exp = Experiment(cfg)
    states = ClientStates(exp.algorithm, exp.space, tmp_path / "run" / "client_states", 12)
    states.load_state_dict(ck["client_states"])
    assert 3 < len(states.store.written()) <= 12
    full = torch.stack([states.get(i)["lambda"].double() for i in range(12)]).mean(0)
    running = ck["server_state"]["lambda_sum"].double() / 12
    assert full.abs().max() > 1e-3  # not trivially zero
    torch.testing.assert_close(running, full, atol=1e-6, rtol=0)


def test_closing_releases_every_descriptor(tmp_path):
    import os

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    exp = Experiment(tiny_config(algorithm="feddyn"))
    states = ClientStates(exp.algorithm, exp.space, tmp_path / "cs", exp.num_clients)
    states.put(1, {"lambda": torch.ones(exp.space.total)})
    generation = states.state_dict()["__store__"]["generation"]
    assert open_fds() > before  # the records' file and the stamps' map
    states.close()
    assert states.store is None and open_fds() == before
    again = ClientStates(exp.algorithm, exp.space, tmp_path / "cs", exp.num_clients)
    again.load_state_dict({"__store__": {"generation": generation}})
    assert torch.equal(again.get(1)["lambda"], torch.ones(exp.space.total))
    again.close()
    assert open_fds() == before


def test_no_record_is_mapped_into_the_process(tmp_path):
    """Records are read and written at their offsets (a map took a page fault a page: 13-27 ms
    a FedDyn record of the standard CNN); only the stamps, 16 bytes a client, are mapped."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps here")
    store = StateStore.create(tmp_path, 40, _state(0.0))
    for client in range(0, 40, 3):
        store.put(client, _state(float(client)))
    mapped = maps.read_text()
    assert str(tmp_path / "stamps.i64") in mapped and "data.f32" not in mapped
    assert [float(store.get(c)["lambda"][0]) for c in (0, 3, 39)] == [0.0, 3.0, 39.0]
    store.close()


def test_a_strided_state_is_written_as_its_values(tmp_path):
    """A 1-D view with gaps (reshape keeps it one) is written as a copy of its values."""
    store = StateStore.create(tmp_path, 3, _state(0.0))
    gappy = {"lambda": torch.arange(12.0)[::2], "local.1": torch.arange(4.0).view(2, 2).t()}
    store.put(1, gappy)
    got = store.get(1)
    assert torch.equal(got["lambda"], gappy["lambda"]) and torch.equal(
        got["local.1"], gappy["local.1"]
    )
    store.close()


def test_a_write_that_fails_partway_leaves_the_last_good_version(tmp_path, monkeypatch):
    """A record half written (a full disk) is never read back: its slot is unstamped first."""
    store = StateStore.create(tmp_path, 3, _state(0.0))
    store.put(0, _state(1.0))
    store.commit()
    store.put(0, _state(2.0))  # after the checkpoint: the other slot

    def half(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_store, "_write_all", half)
    with pytest.raises(OSError):
        store.put(0, _state(3.0))  # over the 2.0 slot: the checkpoint's 1.0 is kept
    assert torch.equal(store.get(0)["lambda"], _state(1.0)["lambda"])
    store.close()
