"""End to end with the real detector: simulated Avia bag → replay through ROS → DetectorNode (real
DetectionPipeline, CPU, eager) → Detection3DArray, compared with the bag's ground truth (the demo's
own code path). With trained weights car detections must match the ground truth; with the untrained
placeholder only the structure can be checked, and the test says so (XFAIL)."""

from __future__ import annotations

import math

import numpy as np

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")
pytest.importorskip("livox_infer.pipeline")

from livox_infer.tools.demo import run_demo  # noqa: E402

pytestmark = pytest.mark.ros
FRAMES = 8


def test_replayed_bag_through_the_node_matches_ground_truth(tmp_path):
    import torch

    torch.set_num_threads(2)
    # rate 0.5: 5 Hz, so a 2-core CI machine processes every frame
    result = run_demo(tmp_path, frames=FRAMES, seed=3, rate=0.5, device="cpu", use_compile=False, quiet=True)
    d = result.diagnostics
    assert int(d["frames_received"]) == FRAMES
    assert int(d["frames_rejected"]) == 0 and int(d["frames_failed"]) == 0
    assert int(d["frames_processed"]) + int(d["frames_dropped"]) == FRAMES
    processed = [f for f in result.frames if f.processed]
    assert len(processed) == int(d["frames_processed"]) >= FRAMES // 2
    assert all(math.isfinite(f.latency_ms) and f.latency_ms > 0 for f in processed)
    assert sum(bool(f.gt_names) for f in result.frames) >= FRAMES // 2, "the simulated drive should have objects"
    assert result.bev_path is not None and result.bev_path.stat().st_size > 10_000
    assert d["backend"].startswith("cpu") and d["model"] == "lite"
    if not result.trained:
        pytest.xfail("model weights are the untrained placeholder: structure checked, accuracy not yet")
    # Cars are the class the detector is judged on here (eval covers all classes): cars within 40 m
    # (well inside the lite grid, many returns each) must mostly be found, most car detections must be
    # real, and matched boxes must overlap well after the trip through Detection3DArray (yaw quaternion).
    def near_car(f, j):
        return f.gt_names[j] == "car" and float(np.hypot(*f.gt_boxes[j, :2])) < 40.0

    cars_gt = sum(near_car(f, j) for f in processed for j in range(len(f.gt_names)))
    cars_found = sum(near_car(f, m[1]) for f in processed for m in f.matches)
    car_dets = sum(f.det_names.count("car") for f in processed)
    car_hits = [m for f in processed for m in f.matches if f.det_names[m[0]] == "car"]
    assert cars_gt > 0 and car_dets > 0
    assert cars_found >= 0.5 * cars_gt, (cars_found, cars_gt)
    assert len(car_hits) >= 0.5 * car_dets, (len(car_hits), car_dets)
    assert np.mean([m[3] for m in car_hits]) >= 0.4

class OraclePipeline:
    """Answers with the bag's own ground truth: checks the chain replay → node → message → matching
    with exact expectations, independent of how well the model is trained."""

    def __init__(self, bag) -> None:
        from livox_infer.bags import read_detections

        self.gt = {f.stamp_ns: f for f in read_detections(bag)}
        self.backend = "oracle"

    def detect(self, msg):
        from livox_infer import CLASS_NAMES
        from livox_infer.decode.pointcloud import decode_pointcloud2
        from test_node_support import FakeDetections

        g = self.gt[decode_pointcloud2(msg).stamp_ns]
        return FakeDetections(g.boxes, g.labels, np.full(len(g.labels), 0.9, np.float32),
                              [CLASS_NAMES[i] for i in g.labels], timings_ms={"total": 0.1})

    def update(self, **options) -> None:
        pass


def test_ground_truth_answers_match_perfectly_through_ros(tmp_path):
    result = run_demo(tmp_path, frames=5, seed=5, rate=0.5, device="cpu", use_compile=False, quiet=True,
                      pipeline_factory=lambda options: OraclePipeline(tmp_path / "demo_bag"), bev=True)
    processed = [f for f in result.frames if f.processed]
    assert len(processed) >= 3
    for f in processed:
        assert f.fp == 0 and f.fn == 0 and f.tp == len(f.gt_names)
        assert all(m[2] < 1e-4 and m[3] > 0.999 for m in f.matches)  # same centre, IoU 1 (float32 round trip)
    assert result.bev_path.is_file()
