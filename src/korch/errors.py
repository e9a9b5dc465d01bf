"""The error korch raises for bad input: one line, shown to the user without a traceback.

Anything the user can fix (a missing file, a symbolic dimension without an
override, an attribute korch cannot honour) is a ``KorchError``; the CLI prints
its message and exits with status 2. Any other exception is a bug in korch.
"""


class KorchError(Exception):
    """A problem with the user's input, explained in one line."""

    exit_code = 2
