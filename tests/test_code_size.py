"""Files stay small enough to read: one idea per module (as tinygrad's sz.py watches its line count)."""

from pathlib import Path

MAX_LINES = 500
SRC = Path(__file__).resolve().parents[1] / "src" / "korch"


def test_every_module_is_under_the_line_limit():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules: {long}"


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
               if p.stat().st_size and not p.read_text().lstrip().startswith(('"""', 'r"""'))]
    assert not missing, missing
