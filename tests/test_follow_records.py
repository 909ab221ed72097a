"""Following another process's rounds (Flower's launcher reading the ServerApp's metrics.jsonl):
each whole line read once, checked as a run reads its own, its checksum taken off; a torn last
line waits for its end; a damaged line is left out."""

from __future__ import annotations

import json

from fedbug.results import metrics_line, new_records, with_crc


def test_rounds_are_read_once_checked_and_without_their_checksum(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert new_records(path, 0) == ([], 0)  # not written yet
    one, two = metrics_line({"round": 1, "test_acc": 0.5}), metrics_line({"round": 2})
    path.write_text(one + two[:5])  # round 2 half written
    records, seen = new_records(path, 0)
    assert records == [{"round": 1, "test_acc": 0.5}] and seen == len(one.encode())
    assert new_records(path, seen) == ([], seen)  # nothing whole since
    damaged = with_crc({"round": 3})
    damaged["round"] = 4  # its checksum no longer fits
    path.write_text(one + two + json.dumps(damaged) + "\n")
    records, end = new_records(path, seen)
    assert records == [{"round": 2}] and end == path.stat().st_size
