"""The demo's per-frame matching is the evaluation's (`assign_frame`) at the loose IoU thresholds, per class."""

import numpy as np

from livox_infer.tools.demo import match_frame

CAR = [10.0, 0.0, 0.8, 4.2, 1.8, 1.5, 0.0]
PED = [8.0, 3.0, 0.9, 0.6, 0.6, 1.7, 0.0]


def test_demo_matches_by_class_and_iou():
    shifted = CAR.copy()
    shifted[0] += 1.0  # BEV IoU (3.2 x 1.8) / (5.2 x 1.8) = 0.62 >= 0.5
    far = CAR.copy()
    far[0] += 2.5  # IoU 0.25 < 0.5: a false positive although its centre is 2.5 m away
    dets = np.array([shifted, far, PED])
    out = match_frame(dets, ["car", "car", "car"], [0.9, 0.95, 0.8], np.array([CAR, PED]), ["car", "pedestrian"])
    assert [(d, g) for d, g, _, _ in out] == [(0, 0)]  # the pedestrian-shaped car box never matches a pedestrian
    assert abs(out[0][2] - 1.0) < 1e-9 and abs(out[0][3] - 3.2 / 5.2) < 1e-6


def test_demo_match_handles_empty_frames():
    assert match_frame(np.zeros((0, 7)), [], [], np.array([CAR]), ["car"]) == []
    assert match_frame(np.array([CAR]), ["car"], [0.5], np.zeros((0, 7)), []) == []
