"""The freeze policy's state in a checkpoint: under ``"policy"`` (whatever the policy), and a
checkpoint from before, which kept it under FreezeFL's word ``"deadline"``, resumes exactly."""

from tiny import tiny_config, without_timing

from fedbug.engine import run_experiment
from fedbug.results import RunDir
from fedbug.results.checkpoint import save_checkpoint_file


def _cfg():
    return tiny_config(
        method="freezefl",
        freezefl={"beta": 50.0, "T0": 0.2},
        system={"abilities": "uniform", "ability_min": 0.5, "ability_max": 3.0},
        num_clients=6,
        clients_per_round=3,
        local_steps=2,
        rounds=3,
        checkpoint_every=1,
    )


def test_old_checkpoints_policy_key_resumes_exactly(tmp_path):
    cfg = _cfg()
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    rd = RunDir(tmp_path / "cut")
    ck = rd.load_checkpoint()
    sim = ck["simulation"]
    assert "deadline" not in sim and sim["policy"]["value"] != 0.2  # T0, updated
    sim["deadline"] = sim.pop("policy")  # as the fedbug before the rename wrote it
    save_checkpoint_file(rd.checkpoint_path, ck)  # checksummed again
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert "policy" in rd.load_checkpoint()["simulation"]  # written again under the new key
