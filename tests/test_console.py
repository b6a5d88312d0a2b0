"""Tables written to a pipe or a file keep every cell whole."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from headway.console import print_table, printable


def _wide_table() -> Table:
    t = Table(title="a title wider than it needs to be for this small test table")
    for name in ("policy", "metric", "Helios", "headway (same policy)", "headway impact", "impact beats it"):
        t.add_column(name, no_wrap=True)
    t.add_row("fifo", "time_to_success_mean", "35.0h", "33.2h", "-", "-")
    return t


def test_a_piped_table_wider_than_80_columns_is_printed_whole() -> None:
    buf = io.StringIO()
    print_table(_wide_table(), Console(file=buf, highlight=False))  # not a terminal: Rich would take 80
    text = buf.getvalue()
    assert "time_to_success_mean" in text and "headway (same policy)" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_table_that_fits_prints_as_rich_prints_it() -> None:
    small = Table()
    small.add_column("a")
    small.add_row("1")
    ours, theirs = io.StringIO(), io.StringIO()
    print_table(small, Console(file=ours, highlight=False))
    Console(file=theirs, highlight=False).print(small)
    assert ours.getvalue() == theirs.getvalue()


def test_bidi_overrides_in_a_name_show_as_escapes_and_right_to_left_letters_stay() -> None:
    # 'admin' followed by an override that would make the rest of the name display reversed.
    assert printable("admin\u202etxt.exe") == "admin\\u202etxt.exe"
    assert printable("a\u2066b\u2069") == "a\\u2066b\\u2069"
    assert printable("שלום مرحبا 漢字 e\u0301 🙂\tx") == "שלום مرحبا 漢字 e\u0301 🙂\tx"
