"""``korch db stats|clear``: tables of the profile database, deletion with a count, one-line errors."""

from korch import config
from korch.backends.db import ProfileDB, Record
from korch.cli import main
from tests.test_cli import assert_one_line_error, korch


def fill(path):
    with ProfileDB(path) as db:
        db.put([Record("a", "h100", "triton", "3.6.0", "ok", 1e-6),
                Record("b", "h100", "triton", "3.6.0", "check_failed", None, "max rel error 0.5"),
                Record("a", "h100", "inductor", "2.13", "ok", 2e-6),
                Record("a", "cpu", "triton", "3.6.0", "ok", 9e-6)])


def table_rows(text):
    """The cells of each table row that has any, as lists of stripped strings."""
    lines = [line for line in text.splitlines() if "│" in line]
    rows = [[cell.strip() for cell in line.strip("│┃ ").split("│")] for line in lines]
    return [row for row in rows if row != ["device", "backend", "records", "ok", "failed"]]


def test_stats_prints_records_by_device_and_backend(tmp_path, capsys):
    path = tmp_path / "p.sqlite"
    fill(path)
    assert main(["db", "stats", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 records (3 ok, 1 failed)" in out and "KiB" in out
    assert sorted(table_rows(out)) == sorted([["h100", "triton", "2", "1", "1"], ["h100", "inductor", "1", "1", "0"],
                                              ["cpu", "triton", "1", "1", "0"]])


def test_stats_of_a_missing_file_says_it_is_empty(tmp_path, capsys):
    path = tmp_path / "none.sqlite"
    assert main(["db", "stats", "--db", str(path)]) == 0
    assert "empty" in capsys.readouterr().out
    assert not path.exists()


def test_default_path_is_in_the_cache_dir(tmp_path, capsys):
    fill(tmp_path / "profile.sqlite")
    with config.patch(cache_dir=tmp_path):
        assert main(["db", "stats"]) == 0
    assert "4 records" in capsys.readouterr().out


def test_clear_one_device_then_all(tmp_path, capsys):
    path = tmp_path / "p.sqlite"
    fill(path)
    assert main(["db", "clear", "--db", str(path), "--device", "h100"]) == 0
    assert "deleted 3 records of device h100" in capsys.readouterr().out
    assert ProfileDB(path).stats()["rows"] == 1
    assert main(["db", "clear", "--db", str(path)]) == 0
    assert "deleted 1 records" in capsys.readouterr().out
    assert ProfileDB(path).stats()["rows"] == 0


def test_a_corrupt_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\x00\xffnot sqlite at all" * 300)
    assert_one_line_error(korch("db", "stats", "--db", bad), "bad.sqlite", "not a database")
    assert_one_line_error(korch("db", "clear", "--db", bad), "bad.sqlite")
