"""The error korch raises for bad input: one line, shown to the user without a traceback.

Anything the user can fix (a missing file, a symbolic dimension without an
override, an attribute korch cannot honour) is a ``KorchError``; the CLI prints
its message and exits with status 2. Any other exception is a bug in korch.
"""


class KorchError(Exception):
    """A problem with the user's input, explained in one line."""

    exit_code = 2


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """``exc`` as ``Type: first line of its message`` (at most ``limit`` characters), for errors that quote a
    library's failure."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:limit]
