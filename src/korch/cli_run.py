"""``korch run OUTDIR``: run an executable on given or seeded inputs, print its outputs, and with ``--check``
compare them with ONNX Runtime on the original model (exit 1 on a mismatch).

An executable built for a range of sizes (``korch optimize --dynamic``) runs at
the size of the given inputs, at ``--dim NAME=SIZE``, or, with ``--check`` and
neither, at every bucket's smallest and largest size.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

from korch.cli_inputs import read_arrays, read_npz
from korch.errors import KorchError


def _sizes(executable, args, given: dict) -> list[int | None]:
    """The sizes to run a bucketed executable at (``[None]``: the executable's own input shapes)."""
    from korch.frontend.inputs import parse_dim
    from korch.runtime.buckets import BucketedExecutable, check_sizes

    asked = dict(parse_dim(s) for s in args.dim or ())
    if not isinstance(executable, BucketedExecutable):
        if asked:
            raise KorchError(f"--dim is for executables built with korch optimize --dynamic; {args.outdir} takes "
                             f"{executable.describe_inputs()}")
        return [None]
    size_range = executable.size_range
    unknown = [name for name in asked if name != size_range["dim"]]
    if unknown:
        raise KorchError(f"--dim names {unknown[0]}; {args.outdir} serves {size_range['dim']}="
                         f"{size_range['low']}..{size_range['high']}")
    if given:
        return [None]
    if asked:
        return [asked[size_range["dim"]]]
    return check_sizes(executable.buckets) if args.check else [size_range["high"]]


def cmd_run(args) -> int:
    from korch.runtime.bundle import manifest_path

    # what a wrong command line gets wrong, said before torch is imported (seconds)
    manifest_path(args.outdir)
    given = {**(read_npz(args.inputs, "--inputs") or {}), **read_arrays(args.input)}

    from korch.api import load
    from korch.runtime.selfcheck import given_at_build

    executable = load(args.outdir, target=args.target, allow_unchecked=args.allow_unchecked)
    unknown = [n for n in given if n not in executable.input_specs]
    if unknown:
        raise KorchError(f"unknown input(s) {', '.join(unknown)}; the executable takes {executable.describe_inputs()}")
    built_with = {n: v for n, v in given_at_build(executable).items() if n not in given}
    if built_with:
        given.update(built_with)
        print(f"input(s) given with --input-value when built: {', '.join(built_with)}")
    ok = True
    for size in _sizes(executable, args, {n: v for n, v in given.items() if n not in built_with}):
        ok &= _run_once(executable, args, dict(given), size)
    return 0 if ok else 1


def _run_once(executable, args, feeds: dict, size: int | None) -> bool:
    import numpy as np
    import onnx

    from korch.runtime.selfcheck import check_outputs, reference, seeded_inputs

    specs = executable.input_specs if size is None else executable.specs_at(size)
    where = "" if size is None else f" at {executable.size_range['dim']}={size}"
    random = [n for n in executable.input_names if n not in feeds]
    if random:
        feeds.update({n: v for n, v in seeded_inputs(specs).items() if n in random})
        print(f"seeded random input(s){where}: {', '.join(random)}")
    start = time.perf_counter()
    outputs = executable.run(feeds)
    if not hasattr(executable, "kernels"):
        what = "its bucket's compiled unit"
    else:
        what = "its compiled unit" if executable.unit is not None else f"{len(executable.kernels)} kernels"
    print(f"ran {what}{where} on {executable.device} in {(time.perf_counter() - start) * 1e3:.1f} ms (first call)")
    for name, value in outputs.items():
        stats = f"mean {float(np.mean(value)):.6g}, max |x| {float(np.abs(value).max(initial=0)):.6g}" \
            if value.size and value.dtype.kind in "fiub" else ""
        print(f"  {name}: {'x'.join(map(str, value.shape))} {value.dtype} {stats}")
    if args.save_outputs:
        from korch.fsutil import atomic_write_bytes

        for name, value in outputs.items():
            buffer = io.BytesIO()
            np.save(buffer, value)
            atomic_write_bytes(Path(args.save_outputs) / f"{name.replace('/', '_')}.npy", buffer.getvalue())
        print(f"wrote the outputs to {args.save_outputs}")
    if not args.check:
        return True
    from korch.runtime.bundle import verified_path

    model = onnx.load(str(verified_path(args.outdir, "reference.onnx", executable.manifest)))
    expected, spreads = reference(model, feeds, executable.output_names)
    tolerance = executable.precision.model_tolerance if args.tolerance is None else args.tolerance
    check = check_outputs(outputs, expected, tolerance, spreads)
    for o in check.outputs:
        widened = f" (within {o.tolerance:.3g}, twice ONNX Runtime's own spread)" if o.tolerance else ""
        print(f"  {o.name}: max abs error {o.max_abs:.3g}, max rel error {o.max_rel:.3g}, "
              f"relative norm {o.rel_norm:.3g}{widened} {'ok' if o.ok else 'MISMATCH'}")
    print(check.summary())
    return check.ok
