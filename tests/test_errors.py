"""fedbug.errors.first_line: the one rule for an error's one-line message."""

from __future__ import annotations

from fedbug.errors import first_line


def test_first_line_of_a_message_that_runs_on():
    e = RuntimeError("\n  shape mismatch.\nat line 3\n")
    assert first_line(e) == "shape mismatch."
    assert first_line(e, drop_period=True) == "shape mismatch"
    assert first_line("a text\nmore") == "a text"


def test_an_empty_message_gives_the_type_name_or_the_given_text():
    assert first_line(ValueError()) == "ValueError"
    assert first_line(ValueError("  \n ")) == "ValueError"
    assert first_line(ValueError(), empty="") == ""
    assert first_line("") == ""
