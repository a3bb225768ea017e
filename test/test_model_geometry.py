"""Rotated IoU, NMS, point-in-box counts and the ground-plane / levelling helpers."""

import math

import numpy as np
import pytest
import torch

from livox_infer.detector.boxes import bev_iou, iou_3d, points_in_boxes, rotated_nms
from livox_infer.ground import Mount, estimate_mount, level_boxes, level_points, unlevel_boxes

torch.set_num_threads(1)


def box(x=0.0, y=0.0, z=0.0, l=4.0, w=2.0, h=1.5, yaw=0.0):
    return [x, y, z, l, w, h, yaw]


def t(*boxes):
    return torch.tensor(boxes, dtype=torch.float64)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (box(), box(), 1.0),
        (box(), box(x=1.0), 6.0 / 10.0),  # overlap 3x2 of two 4x2 boxes
        (box(), box(yaw=math.pi / 2), 4.0 / 12.0),  # cross: 2x2 overlap
        (box(), box(yaw=math.pi), 1.0),  # heading flipped: same rectangle
        (box(), box(x=10.0), 0.0),
        (box(), box(x=4.0), 0.0),  # touching edges
        (box(l=2, w=2), box(l=2, w=2, yaw=math.pi / 4), 8 * (math.sqrt(2) - 1) / (8 - 8 * (math.sqrt(2) - 1))),
    ],
)
def test_bev_iou_known_values(a, b, expected):
    assert bev_iou(t(a), t(b)).item() == pytest.approx(expected, abs=1e-6)
    assert bev_iou(t(b), t(a)).item() == pytest.approx(expected, abs=1e-6)


def _monte_carlo_iou(a, b, n=400_000, seed=0):
    rng = np.random.default_rng(seed)
    lo = np.minimum(a[:2], b[:2]) - 4
    pts = rng.uniform(lo, lo + 8 + np.abs(np.array(a[:2]) - np.array(b[:2])), size=(n, 2))

    def inside(bx):
        dx, dy = pts[:, 0] - bx[0], pts[:, 1] - bx[1]
        c, s = math.cos(bx[6]), math.sin(bx[6])
        return (np.abs(c * dx + s * dy) <= bx[3] / 2) & (np.abs(-s * dx + c * dy) <= bx[4] / 2)

    ia, ib = inside(a), inside(b)
    return (ia & ib).sum() / max((ia | ib).sum(), 1)


def test_bev_iou_matches_monte_carlo_on_random_pairs():
    rng = np.random.default_rng(1)
    for _ in range(6):
        a = box(*rng.uniform([-1, -1, 0, 1, 0.5, 1, -3], [1, 1, 0, 5, 2.5, 2, 3]))
        b = box(*rng.uniform([-1, -1, 0, 1, 0.5, 1, -3], [1, 1, 0, 5, 2.5, 2, 3]))
        assert bev_iou(t(a), t(b)).item() == pytest.approx(_monte_carlo_iou(a, b), abs=0.01)


def test_iou_3d_uses_vertical_overlap():
    a = box(h=2.0)
    b = box(z=1.0, h=2.0)  # half the height overlaps: inter = 8*1, union = 16+16-8
    assert iou_3d(t(a), t(b)).item() == pytest.approx(8.0 / 24.0, abs=1e-6)
    assert iou_3d(t(a), t(box(z=3.0, h=2.0))).item() == 0.0
    assert iou_3d(t(a), t(a)).item() == pytest.approx(1.0, abs=1e-6)


def test_pairwise_shapes_and_empty_inputs():
    a = t(box(), box(x=1), box(x=30))
    assert bev_iou(a, a[:2]).shape == (3, 2)
    assert bev_iou(a, torch.zeros((0, 7), dtype=torch.float64)).shape == (3, 0)


def test_rotated_nms_is_class_wise_and_score_ordered():
    boxes = torch.tensor([box(), box(x=0.3), box(x=20), box(x=0.2)], dtype=torch.float32)
    scores = torch.tensor([0.8, 0.9, 0.5, 0.7])
    labels = torch.tensor([0, 0, 0, 1])
    keep = rotated_nms(boxes, scores, labels, 0.5, max_keep=10)
    # box 1 (0.9) suppresses box 0 (same class, IoU high); box 3 is another class; box 2 far away
    assert keep.tolist() == [1, 3, 2]
    assert rotated_nms(boxes, scores, labels, 0.5, max_keep=2).tolist() == [1, 3]
    assert rotated_nms(boxes, scores, labels, [0.99, 0.99, 0.99], 10).numel() == 4
    assert rotated_nms(boxes[:0], scores[:0], labels[:0], 0.5, 10).numel() == 0


def test_rotated_nms_cross_class_suppresses_other_classes_on_the_same_object():
    # a rider seen as pedestrian (0.6) and cyclist (0.5) at the same place, a pedestrian next to a car
    boxes = torch.tensor([box(l=0.8, w=0.6), box(l=1.8, w=0.6), box(x=10, l=4, w=2), box(x=12.5, l=0.6, w=0.6)],
                         dtype=torch.float32)
    scores = torch.tensor([0.6, 0.5, 0.9, 0.4])
    labels = torch.tensor([1, 2, 0, 1])
    assert rotated_nms(boxes, scores, labels, 0.1, 10).tolist() == [2, 0, 1, 3]  # class-wise only
    # IoU(ped, cyclist) = 0.48/1.08 > 0.3: the cyclist goes; the separate pedestrian stays
    assert rotated_nms(boxes, scores, labels, 0.1, 10, cross_class_iou=0.3).tolist() == [2, 0, 3]
    assert rotated_nms(boxes, scores, labels, 0.1, 10, cross_class_iou=0.5).tolist() == [2, 0, 1, 3]


def test_points_in_boxes_counts_rotated_box():
    b = np.array([box(x=10, y=0, z=1, l=4, w=2, h=2, yaw=math.pi / 2)], np.float32)  # long axis along y
    pts = np.array([[10, 1.5, 1, 0], [10, -1.9, 0.1, 0], [11.5, 0, 1, 0], [10, 0, 2.5, 0]], np.float32)
    assert points_in_boxes(pts, b).tolist() == [2]


def _plane_cloud(mount: Mount, n=20000, seed=0, clutter=True):
    """Ground points of a level world seen by a tilted sensor, plus walls and boxes above it."""
    rng = np.random.default_rng(seed)
    world = np.c_[rng.uniform(2, 45, n), rng.uniform(-20, 20, n), rng.normal(0, 0.02, n)]
    if clutter:
        wall = np.c_[rng.uniform(5, 40, n // 4), np.full(n // 4, 15.0), rng.uniform(0, 4, n // 4)]
        car = np.c_[rng.uniform(10, 14, n // 8), rng.uniform(-3, -1, n // 8), rng.uniform(0.2, 1.5, n // 8)]
        world = np.r_[world, wall, car]
    world[:, 2] -= mount.height  # sensor at the origin, ground below
    rot = mount.rotation()  # sensor -> levelled
    sensor = world @ rot  # = rot.T applied to each row: levelled -> sensor
    return np.c_[sensor, rng.uniform(0, 100, len(sensor))].astype(np.float32)


@pytest.mark.parametrize("pitch, roll, height", [(0.0, 0.0, 1.8), (3.0, -2.0, 0.6), (-2.5, 1.0, 2.4)])
def test_estimate_mount_recovers_height_and_tilt(pitch, roll, height):
    true = Mount.from_pitch_roll(height, pitch, roll)
    est = estimate_mount(_plane_cloud(true))
    assert est is not None
    assert est.height == pytest.approx(height, abs=0.05)
    angle = math.degrees(math.acos(min(1.0, float(np.dot(est.up, true.up)))))
    assert angle < 0.3
    levelled = level_points(_plane_cloud(true, clutter=False), est)
    assert abs(float(np.median(levelled[:, 2]))) < 0.05


def test_estimate_mount_rejects_clouds_without_ground():
    assert estimate_mount(np.zeros((10, 4), np.float32)) is None
    rng = np.random.default_rng(0)
    sky = np.c_[rng.uniform(5, 30, 2000), rng.uniform(-5, 5, 2000), rng.uniform(5, 9, 2000), np.zeros(2000)]
    assert estimate_mount(sky) is None  # "ground" above the sensor is implausible


def test_estimate_mount_ignores_non_finite_and_far_points():
    """Rows with NaN / inf anywhere in x, y, z, or beyond the candidate range, change nothing: the same mount as the
    cloud without them (the filter tests finiteness through x + y + z)."""
    clean = _plane_cloud(Mount.from_pitch_roll(1.7, 1.0, 0.5), n=8000)
    bad = np.array([[np.nan, 3.0, -1.7, 1.0], [5.0, np.inf, -1.7, 1.0], [6.0, 1.0, -np.inf, 1.0],
                    [3e38, 3e38, 3e38, 1.0], [-3e38, 1.0, -3e38, 1.0], [80.0, 0.0, -1.7, 1.0], [1.0, 0.5, -1.7, 1.0],
                    [10.0, 0.0, 20.0, 1.0]], np.float32)
    dirty = np.insert(clean, [0, 100, 4000, 4000, 8000, 8000, 9000, 9999], bad, axis=0)
    a, b = estimate_mount(clean), estimate_mount(dirty)
    assert a is not None and (a.height, a.up) == (b.height, b.up)


def test_level_and_unlevel_boxes_round_trip():
    m = Mount.from_pitch_roll(1.5, 2.0, -1.0)
    b = np.array([box(x=10, y=2, z=-0.8, yaw=0.5), box(x=30, y=-8, z=-1.0, yaw=-2.9)], np.float32)
    lv = level_boxes(b, m)
    back = unlevel_boxes(lv, m)
    assert np.allclose(back[:, :6], b[:, :6], atol=1e-4)
    assert np.allclose(back[:, 6], b[:, 6], atol=1e-3)  # yaw: heading projected to the plane and back
    # a point at a box centre stays at the box centre when levelled
    c = np.c_[b[:, :3], np.zeros(2)].astype(np.float32)
    assert np.allclose(level_points(c, m)[:, :3], lv[:, :3], atol=1e-4)


def test_level_points_is_one_function_for_numpy_and_torch():
    """The pipeline levels torch tensors on its device with the same function the tools use on numpy arrays."""
    import torch

    from livox_infer.ground import Mount, level_points

    rng = np.random.default_rng(3)
    pts = rng.uniform(-20, 20, (500, 4)).astype(np.float32)
    mount = Mount.from_pitch_roll(1.7, 4.0, -2.0)
    a = level_points(pts, mount)
    b = level_points(torch.from_numpy(pts), mount)
    assert isinstance(b, torch.Tensor) and b.shape == (500, 4)
    np.testing.assert_allclose(b.numpy(), a, atol=1e-5)
    assert np.array_equal(b[:, 3].numpy(), pts[:, 3]) and not np.shares_memory(a, pts)


def test_the_pipeline_reports_the_ground_height_its_clouds_show():
    from livox_infer.ground import mount_mismatch
    from livox_infer.pipeline import DetectionPipeline

    rng = np.random.default_rng(4)
    pts = np.c_[rng.uniform(2, 30, 5000), rng.uniform(-10, 10, 5000), np.full(5000, -0.8) + rng.normal(0, 0.02, 5000),
                np.zeros(5000)].astype(np.float32)
    fixed = DetectionPipeline("lite", compile=False, sensor_height=1.8)  # tilt "auto": the plane is fitted anyway
    d = fixed.detect(pts)
    assert d.sensor_height == pytest.approx(1.8) and d.ground_height_seen == pytest.approx(0.8, abs=0.05)
    assert mount_mismatch(d.sensor_height, d.ground_height_seen) == pytest.approx(-1.0, abs=0.05)
    auto = DetectionPipeline("lite", compile=False, sensor_height="auto").detect(pts)
    assert mount_mismatch(auto.sensor_height, auto.ground_height_seen) is None
    both_fixed = DetectionPipeline("lite", compile=False, sensor_height=1.8, sensor_tilt=None).detect(pts)
    assert math.isnan(both_fixed.ground_height_seen)  # nothing estimated: nothing to compare
    assert mount_mismatch(1.8, float("nan")) is None and mount_mismatch(1.8, 1.4) is None
