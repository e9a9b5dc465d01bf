"""GCC's inliner limits raised for translation units of many kernels (``backends/inlining.py``)."""

import shlex

from korch.backends import inlining


def test_a_gcc_command_gets_the_raised_limits_once_and_another_compiler_none():
    command = "g++ /tmp/a.cpp -O3 -march=native -o /tmp/a.so"
    raised = inlining.with_raised_limits(command)
    assert shlex.split(raised) == ["g++", *inlining.FLAGS, *shlex.split(command)[1:]]
    assert inlining.with_raised_limits(raised) == raised
    clang = "clang++ /tmp/a.cpp -O3 -o /tmp/a.so"
    assert inlining.with_raised_limits(clang) == clang


def test_inductors_optimised_compiles_raise_the_limits_only_while_active_and_not_its_wrappers():
    from torch._inductor import cpp_builder

    def flags(min_optimize: bool) -> list[str]:
        return cpp_builder._get_optimization_cflags("g++", min_optimize)[0]

    before = flags(False)
    with inlining.raised_inline_limits():
        optimised, wrapper = flags(False), flags(True)
        command = cpp_builder.CppBuilder(
            name="k", sources="k.cpp", BuildOption=cpp_builder.CppTorchOptions()).get_command_line()
    unprefixed = [flag[1:] for flag in inlining.FLAGS]  # Inductor puts a "-" before each
    assert all(f in optimised for f in unprefixed) and not any(f in before for f in unprefixed)
    assert not any(f in wrapper for f in unprefixed)
    assert all(flag in shlex.split(command) for flag in inlining.FLAGS)
    assert flags(False) == before
