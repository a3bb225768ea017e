"""Non-learned baseline: connected components, rectangle fit, detection on a hand-made scene."""

import math

import numpy as np
import pytest

from livox_infer.errors import ConfigError, PointCloudError
from livox_infer.evaluation.baseline import BaselineDetector, connected_components, min_area_rectangle


def test_connected_components_8_connectivity():
    occ = np.zeros((6, 6), bool)
    occ[0, 0] = occ[1, 1] = True  # diagonal neighbours: one component
    occ[4:6, 3:6] = True
    occ[0, 5] = True
    lab = connected_components(occ)
    assert lab[0, 0] == lab[1, 1]
    assert len({int(v) for v in lab[occ]}) == 3
    assert (lab[~occ] == -1).all()


def test_min_area_rectangle_recovers_rotated_rectangle():
    rng = np.random.default_rng(0)
    yaw = 0.5
    local = np.c_[rng.uniform(-2, 2, 500), rng.uniform(-0.9, 0.9, 500)]
    c, s = math.cos(yaw), math.sin(yaw)
    xy = local @ np.array([[c, s], [-s, c]]) + [10, 3]
    cx, cy, length, width, a = min_area_rectangle(xy)
    assert (cx, cy) == pytest.approx((10, 3), abs=0.1)
    assert length == pytest.approx(4.0, abs=0.15) and width == pytest.approx(1.8, abs=0.15)
    assert abs(math.remainder(a - yaw, math.pi)) < math.radians(3)


def _surface(rng, x0, x1, y0, y1, z0, z1, n):
    """Points on the two sensor-facing sides of an axis-aligned box (what a lidar sees)."""
    a = np.c_[np.full(n, x0), rng.uniform(y0, y1, n), rng.uniform(z0, z1, n)]
    b = np.c_[rng.uniform(x0, x1, n), np.full(n, y0 if y0 > 0 else y1), rng.uniform(z0, z1, n)]
    return np.r_[a, b]


def test_baseline_finds_car_and_pedestrian():
    rng = np.random.default_rng(0)
    h = 1.7
    ground = np.c_[rng.uniform(2, 40, 20000), rng.uniform(-15, 15, 20000), rng.normal(-h, 0.02, 20000)]
    car = _surface(rng, 15.0, 19.4, 2.0, 3.8, 0.3 - h, 1.5 - h, 400)
    ped = np.c_[rng.normal(10, 0.15, 150), rng.normal(-3, 0.15, 150), rng.uniform(0.05 - h, 1.75 - h, 150)]
    pts = np.c_[np.r_[ground, car, ped], rng.uniform(0, 100, 20000 + 800 + 150)].astype(np.float32)
    det = BaselineDetector(sensor_height=h).detect(pts)
    names = sorted(det.labels.tolist())
    assert names == [0, 1]
    car_box = det.boxes[det.labels == 0][0]
    assert car_box[0] == pytest.approx(17.2, abs=0.6) and car_box[1] == pytest.approx(2.9, abs=0.4)
    ped_box = det.boxes[det.labels == 1][0]
    assert ped_box[:2] == pytest.approx([10, -3], abs=0.3)
    auto = BaselineDetector(sensor_height="auto").detect(pts)
    assert sorted(auto.labels.tolist()) == [0, 1]


def test_baseline_input_validation():
    with pytest.raises(ConfigError):
        BaselineDetector(sensor_height="low")
    with pytest.raises(PointCloudError):
        BaselineDetector().detect(np.zeros((5,), np.float32))
    assert len(BaselineDetector().detect(np.zeros((0, 4), np.float32)).boxes) == 0
