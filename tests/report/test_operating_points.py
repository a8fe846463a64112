"""The report's operating points (report.operating): each method at its own width with the width model's prediction
beside the measurement, and whether the model predicted dflash's tokens per target call within its tolerance."""

from __future__ import annotations

import pytest

from dflash_core.report.operating import PREDICTION_TOLERANCE, operating_points, own_widths


def _methods(**taus):  # width (as a keyword string) -> measured tau
    return {"dflash": {"rows": {str(w): {"tokens_per_target_call": t, "speedup": 2.0} for w, t in taus.items()}}}


SETTINGS = {"width_choice": {"table": [{"width": 4, "tokens_per_target_call": 3.0, "model_speedup": 2.0},
                                       {"width": 8, "tokens_per_target_call": 4.0, "model_speedup": 2.4}]},
            "method_widths": {"dflash": {"selected": 8, "table": [{"width": 8, "tokens_per_target_call": 4.0,
                                                                   "model_speedup": 2.4}]},
                              "act": {"selected": "8"}, "mobs": {"selected": True}, "dspark_lite": []}}


def test_each_method_at_its_own_width_carries_the_prediction_and_the_measurement():
    op = operating_points({"dflash": {"rows": {"8": {"tokens_per_target_call": 4.2, "speedup": 2.5}}}}, SETTINGS)
    assert op["methods"] == {"dflash": {"width": 8, "predicted_tokens_per_target_call": 4.0, "model_speedup": 2.4,
                                        "measured_tokens_per_target_call": 4.2, "measured_speedup": 2.5}}
    assert own_widths(SETTINGS) == {"dflash": 8}  # a string, a bool and a list are not widths


@pytest.mark.parametrize(("measured", "within"), [({4: 3.2, 8: 4.3}, True), ({4: 3.2, 8: 5.0}, False),
                                                  ({4: 3.0 * (1 - PREDICTION_TOLERANCE) - 0.01}, False)])
def test_the_model_is_judged_at_every_measured_width_of_dflash(measured, within):
    op = operating_points(_methods(**{str(k): v for k, v in measured.items()}), SETTINGS)
    assert [p["width"] for p in op["dflash_prediction"]] == sorted(measured)
    assert op["within"] is within
    for p in op["dflash_prediction"]:
        assert p["error"] == pytest.approx(p["measured"] / p["predicted"] - 1)


def test_a_run_without_own_widths_has_no_operating_points():
    op = operating_points(_methods(**{"4": 3.0}), {})
    assert op["methods"] == {} and op["dflash_prediction"] == [] and op["within"] is None
