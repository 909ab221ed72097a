"""``fedbug flower worker``'s command line: bad input is one line and exit 2."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedbug.cli import main  # noqa: E402


def test_a_missing_certificate_file_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "ca.pem"
    argv = ["flower", "worker", "--runtime-api", "127.0.0.1:9094", "--root-certificates"]
    assert main([*argv, str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(missing) in err and "PEM" in err


def test_tls_or_insecure_must_be_chosen(capsys):
    with pytest.raises(SystemExit) as e:
        main(["flower", "worker", "--runtime-api", "127.0.0.1:9094"])
    assert e.value.code == 2
    assert "--insecure" in capsys.readouterr().err
