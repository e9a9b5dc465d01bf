"""report.md: what the compiled unit's choices were, in words."""

import pytest

from korch.report.markdown import _executable, predicted_against_measured, unit_seconds


@pytest.mark.parametrize("pointwise, words", [("products", "1x1 convolutions as products"),
                                              ("library", "1x1 convolutions by the library"), (None, None)])
def test_the_units_line_says_how_its_layouts_and_pointwise_convolutions_were_chosen(pointwise, words):
    unit = {"weights": "packed for oneDNN", "boundaries": "channels-last",
            "measured_ms": {"packed for oneDNN": 9.0, "as given to ATen": 9.5}}
    if pointwise:
        unit["pointwise convolutions"] = pointwise
    lines = _executable({"runs": "compiled unit", "unit": unit})
    (line,) = [line for line in lines if line.startswith("- the unit's weights")]
    assert "packed for oneDNN; values a convolution reads stored channels-last between kernels" in line
    assert "as given to ATen 9.5 ms" in line
    assert ("1x1 convolutions" in line) == bool(words) and (not words or words in line)


def test_the_units_line_says_where_attention_runs_and_its_time_is_the_variant_it_runs():
    unit = {"weights": "packed for oneDNN", "products of activations": "MLAS",
            "variant": "packed for oneDNN, products of activations in MLAS",
            "measured_ms": {"packed for oneDNN": 9.0, "packed for oneDNN, products of activations in MLAS": 8.0}}
    executable = {"runs": "compiled unit", "unit": unit}
    (line,) = [line for line in _executable(executable) if line.startswith("- the unit's weights")]
    assert "products of activations and softmaxes in MLAS" in line
    assert unit_seconds(executable) == pytest.approx(0.008)
    del unit["variant"]  # a manifest of an earlier korch: the weights' variant
    assert unit_seconds(executable) == pytest.approx(0.009)


def test_a_unit_variant_that_failed_to_compile_is_named_with_its_error():
    unit = {"weights": "as given to ATen", "measured_ms": {},
            "failed": {"packed for oneDNN": "RuntimeError: no oneDNN here"}}
    lines = _executable({"runs": "compiled unit", "unit": unit})
    assert "- the unit's variant 'packed for oneDNN' failed to compile: RuntimeError: no oneDNN here" in lines


def test_a_measured_plans_prediction_is_set_against_the_unit_it_runs_as_and_a_roofline_one_is_called_a_floor():
    unit = {"weights": "packed for oneDNN", "measured_ms": {"packed for oneDNN": 20.0, "as given to ATen": 10.0}}
    runs = unit_seconds({"runs": "compiled unit", "unit": unit})
    assert runs == pytest.approx(0.020)  # the variant the unit runs, not the fastest number
    assert predicted_against_measured("measured", 0.018, runs).endswith("predicted / measured 0.90")
    assert predicted_against_measured("measured", 0.018, None) == ""
    floor = predicted_against_measured("roofline", 0.005, runs)
    assert floor.startswith("a floor") and "20,000.0 µs the executable runs in" in floor
    assert unit_seconds(None) is None and unit_seconds({"runs": "compiled unit", "unit": {"measured_ms": {}}}) is None


def test_the_search_cost_line_says_when_the_search_measured_ahead():
    from korch.report.markdown import _measurement

    m = {"device": "cpu", "backends": {"inductor": "9"}, "candidates": 9, "signatures": 5, "signatures_asked": 5,
         "measured_share": 1.0, "from_database": 0, "kernels_measured": 5, "below_bound": 0, "failures": []}
    (line,) = [line for line in _measurement(m | {"measure_ahead": 256}) if line.startswith("- search cost")]
    assert "100% of the 5 distinct candidate kernels measured or looked up (each round up to 256 more" in line
    (line,) = [line for line in _measurement(m | {"measure_ahead": 0}) if line.startswith("- search cost")]
    assert "more than its plan" not in line and "looked up; " in line
