"""What a user gives the ``korch`` command about a model's inputs: shapes (``--input-shape``, ``--dim``),
steering values (``--input-value``) and arrays (``--input NAME=FILE.npy``, ``--inputs``/``--check-inputs``
FILE.npz), each read into plain data or refused with a one-line ``KorchError``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from korch.errors import KorchError


def input_shapes(args) -> dict[str, tuple[int, ...] | int]:
    """``--input-shape`` (input name -> dims) and ``--dim`` (dimension name -> size) as one mapping."""
    from korch.frontend.inputs import parse_dim, parse_input_shape

    return {**dict(parse_input_shape(s) for s in args.input_shape or ()), **dict(parse_dim(s) for s in args.dim or ())}


def input_values(args) -> dict:
    from korch.frontend.inputs import parse_input_value

    return dict(parse_input_value(s) for s in args.input_value or ())


def read_arrays(specs: Sequence[str] | None) -> dict:
    import numpy as np

    feeds = {}
    for spec in specs or ():
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise KorchError(f"--input wants NAME=FILE.npy, got {spec!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise KorchError(f"--input {name}: no such file {path}") from None
        except (OSError, ValueError) as exc:
            raise KorchError(f"--input {name}: {path} is not a .npy array ({exc})") from None
    return feeds


def read_npz(path: Path | None, flag: str) -> dict | None:
    """The arrays of an ``.npz`` file by name (None without a path)."""
    import numpy as np

    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise KorchError(f"{flag}: no such file {path}") from None
    except (OSError, ValueError) as exc:
        raise KorchError(f"{flag}: {path} is not an .npz archive of arrays ({exc})") from None
