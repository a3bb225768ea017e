"""Score calibration: the config's knots, the map the pipeline applies, the reliability table and the fit."""

import math

import numpy as np
import pytest
import torch

from livox_infer.detector.calibration import calibrate_scores, calibration_tables, interp, parse_calibration
from livox_infer.detector.config import ModelConfig, read_config_dict
from livox_infer.errors import ConfigError
from livox_infer.evaluation.calibration import (
    compose, expected_calibration_error, fit_knots, operating_points, outcomes, reliability, reliability_table,
)
from livox_infer.evaluation.metrics import FrameBoxes

CLASSES = ("car", "pedestrian", "cyclist")


def test_parse_calibration_checks_knots():
    assert parse_calibration(None, CLASSES) is None
    t = parse_calibration({"car": [[0, 0], [0.5, 0.3], [1, 1]]}, CLASSES)
    assert t[0] == ((0.0, 0.0), (0.5, 0.3), (1.0, 1.0)) and t[1] is None and t[2] is None
    for bad in ({"tractor": [[0, 0], [1, 1]]}, {"car": [[0, 0]]}, {"car": [[0, 0.5], [1, 0.2]]},
                {"car": [[0.5, 0], [0.2, 1]]}, {"car": [[0, 0], [1, 1.5]]}, {"car": "x"}, [1, 2]):
        with pytest.raises(ConfigError, match="score_calibration"):
            parse_calibration(bad, CLASSES)


def test_interp_is_numpy_interp_and_classes_keep_their_own_map():
    xs, ys = torch.tensor([0.0, 0.5, 1.0]), torch.tensor([0.0, 0.2, 1.0])
    x = torch.tensor([-0.1, 0.0, 0.25, 0.5, 0.75, 1.0, 1.2])
    assert torch.allclose(interp(x, xs, ys), torch.from_numpy(np.interp(x.numpy(), xs.numpy(), ys.numpy())).float())
    tables = calibration_tables(parse_calibration({"car": [[0, 0], [0.5, 0.2], [1, 1]]}, CLASSES))
    out = calibrate_scores(torch.tensor([0.5, 0.5, 0.75]), torch.tensor([0, 1, 0]), tables)
    assert torch.allclose(out, torch.tensor([0.2, 0.5, 0.6]))


def test_pipeline_applies_the_calibration(tmp_path):
    from livox_infer.pipeline import DetectionPipeline

    base = ModelConfig.load("lite")
    (tmp_path / "cal.yaml").write_text(f"base: {base.source}\nname: cal\nweights: {base.weights_path()}\n"
                                       "score_calibration: {car: [[0, 0], [1, 0.5]]}\nscore_thresholds: 0.05\n")
    (tmp_path / "raw.yaml").write_text(f"base: {base.source}\nname: raw\nweights: {base.weights_path()}\n"
                                       "score_calibration: null\nscore_thresholds: 0.1\n")  # lite's own calibration off
    assert read_config_dict(tmp_path / "cal.yaml")["grid"] == read_config_dict(base.source)["grid"]
    rng = np.random.default_rng(0)
    car = np.c_[rng.uniform(14, 18.5, 3000), rng.uniform(-1, 1, 3000), rng.uniform(-1.6, -0.3, 3000), np.zeros(3000)]
    ground = np.c_[rng.uniform(2, 50, 20000), rng.uniform(-20, 20, 20000), np.full(20000, -1.75), np.zeros(20000)]
    pts = np.r_[car, ground].astype(np.float32)
    dets = {}
    for name in ("raw", "cal"):
        pipe = DetectionPipeline(model=str(tmp_path / f"{name}.yaml"), device="cpu", compile=False, sensor_height=1.75)
        d = pipe.detect(pts)
        dets[name] = d.scores[d.labels == 0]
    assert len(dets["raw"]) and math.isclose(dets["cal"].max(), dets["raw"].max() / 2, abs_tol=1e-4)


def test_reliability_and_fit_recover_a_known_curve():
    rng = np.random.default_rng(0)
    s = rng.uniform(0.1, 1.0, 4000)
    right = rng.uniform(0, 1, 4000) < s ** 2  # boxes scored s are right s² of the time: over-confident
    rows = reliability(s, right)
    for lo, hi, n, share in rows:
        mid = (lo + hi) / 2
        assert n > 100 and abs(share - mid ** 2) < 0.08
    assert expected_calibration_error(s, right) > 0.1
    knots = fit_knots(s, right)
    xs, ys = np.array(knots).T
    assert np.all(np.diff(ys) >= 0) and abs(np.interp(0.7, xs, ys) - 0.49) < 0.06
    cal = np.interp(s, xs, ys)
    assert expected_calibration_error(cal, right) < 0.04
    assert fit_knots(s[:10], right[:10]) is None  # too few detections to fit
    assert compose([[0, 0], [1, 0.5]], [[0, 0], [0.5, 0.8], [1, 1]]) == [[0.0, 0.0], [0.5, 0.4], [1.0, 0.5]]


def test_outcomes_match_as_ap_does_and_leave_ignored_out():
    gt = FrameBoxes(np.array([[10, 0, 0, 4, 2, 1.5, 0], [20, 5, 0, 4, 2, 1.5, 0]]), np.array([0, 0]))
    det = FrameBoxes(np.array([[10.2, 0, 0, 4, 2, 1.5, 0], [10.0, 0, 0, 4, 2, 1.5, 0], [20, 5, 0, 4, 2, 1.5, 0],
                               [30, 0, 0, 4, 2, 1.5, 0]]), np.array([0, 0, 0, 0]), np.array([0.9, 0.8, 0.7, 0.6]))
    res = outcomes([det], [gt], [np.array([False, True])], CLASSES)
    s, r = res["car"]
    assert s.tolist() == pytest.approx([0.9, 0.8, 0.6]) and r.tolist() == [True, False, False]  # 0.7: on ignored
    ops = operating_points(res, {"car": 0.75}, {"car": 1})
    assert ops["car"]["detections"] == 2 and ops["car"]["precision"] == 0.5 and ops["car"]["recall"] == 1.0
    assert "ECE" in reliability_table(res, "t")


def test_best_f1_threshold():
    from livox_infer.evaluation.calibration import best_f1_threshold

    s = np.array([0.9, 0.8, 0.7, 0.3, 0.2])
    r = np.array([True, True, True, False, False])
    b = best_f1_threshold(s, r, num_gt=4)
    assert b["threshold"] in (0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7) and b["precision"] == 1.0 and b["recall"] == 0.75
    assert b["threshold"] == 0.35  # the lowest threshold reaching the best F1
    assert math.isnan(best_f1_threshold(s, r, num_gt=0)["threshold"])


def test_cross_fitted_ece_judges_each_fit_on_the_other_sources_detections():
    from livox_infer.evaluation.calibration import cross_fitted_ece

    rng = np.random.default_rng(1)

    def source(n, power):
        s = rng.uniform(0.1, 1.0, n)
        return s, rng.uniform(0, 1, n) < s ** power

    # both sources over-confident the same way: each fit, learnt on the other, mends the held-out one
    same = cross_fitted_ece({"a": source(1500, 2), "b": source(1500, 2)})
    assert set(same["sources"]) == {"a", "b"} and same["sources"]["a"]["fitted_on"] == 1500
    assert same["ece_before"] > 0.1 and same["ece_after"] < 0.04
    for d in same["sources"].values():
        assert d["ece_after"] < d["ece_before"] / 3
    # opposite miscalibration: what one source teaches makes the other worse, and the held-out ECE says so
    opposite = cross_fitted_ece({"a": source(1500, 2), "b": source(1500, 0.5)})
    assert opposite["ece_after"] > opposite["ece_before"]
    for key in ("ece_before", "ece_after"):  # a user of one sensor sees its own source's ECE: their weighted mean
        assert opposite[key] == pytest.approx(np.mean([d[key] for d in opposite["sources"].values()]))
    # a complement below the minimum is not fitted; one source alone has no complement
    few = cross_fitted_ece({"a": source(1500, 2), "b": source(10, 2)})
    assert set(few["sources"]) == {"b"}
    assert cross_fitted_ece({"a": source(1500, 2)}) is None
