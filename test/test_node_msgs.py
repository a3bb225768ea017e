"""livox_infer.ros.messages: the geometry and naming the node's messages rely on."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from livox_infer.detector.boxes import box_corners
from livox_infer.ros import messages as ros_msgs


@pytest.mark.parametrize("yaw", [0.0, 0.3, -1.2, math.pi / 2, 3.0, -3.1])
def test_yaw_quaternion_round_trip(yaw):
    q = ros_msgs.yaw_to_quaternion(yaw)
    assert sum(v * v for v in q) == pytest.approx(1.0)
    assert q[0] == q[1] == 0.0
    assert ros_msgs.quaternion_to_yaw(*q) == pytest.approx(yaw, abs=1e-9)


def test_box_corners_follow_size_heading_and_centre():
    box = np.array([10.0, -2.0, 0.5, 4.0, 2.0, 1.5, math.pi / 2])  # heading along +y
    c = box_corners(box)
    assert c.shape == (8, 3)
    np.testing.assert_allclose(c[:, :2].mean(axis=0), [10.0, -2.0], atol=1e-12)
    np.testing.assert_allclose(c[:4, 2], -0.25)
    np.testing.assert_allclose(c[4:, 2], 1.25)
    # length (4 m) now spans y, width (2 m) spans x
    assert np.ptp(c[:, 1]) == pytest.approx(4.0) and np.ptp(c[:, 0]) == pytest.approx(2.0)
    edges = ros_msgs.box_edge_points(box).reshape(12, 2, 3)
    lengths = sorted(np.linalg.norm(e[0] - e[1]) for e in edges)
    np.testing.assert_allclose(lengths, [1.5] * 4 + [2.0] * 4 + [4.0] * 4)


def test_class_names_per_box_or_from_labels():
    per_box = SimpleNamespace(labels=np.array([2, 0, 1]), label_names=["cyclist", "car", "pedestrian"])
    assert ros_msgs.detection_class_names(per_box, 3) == ["cyclist", "car", "pedestrian"]
    from_labels = SimpleNamespace(labels=np.array([1, 1]), label_names=None)
    assert ros_msgs.detection_class_names(from_labels, 2) == ["pedestrian", "pedestrian"]
    out_of_range = SimpleNamespace(labels=np.array([7]), label_names=None)
    assert ros_msgs.detection_class_names(out_of_range, 1) == ["class_7"]


def test_percentiles_and_empty_windows():
    mean, p50, p99 = ros_msgs.percentile_summary([1.0, 2.0, 3.0, 100.0])
    assert mean == pytest.approx(26.5) and p50 == pytest.approx(2.5) and 90 < p99 <= 100
    assert all(math.isnan(v) for v in ros_msgs.percentile_summary([]))


def test_detection_message_round_trip():
    pytest.importorskip("vision_msgs.msg")
    dets = SimpleNamespace(boxes=np.array([[5.0, 1.0, -1.0, 4.5, 1.9, 1.6, -2.0]], np.float32),
                           labels=np.array([0]), scores=np.array([0.77], np.float32), label_names=["car"])
    msg = ros_msgs.detections_to_msg(dets, stamp_ns=3_000_000_007, frame_id="f")
    back = ros_msgs.msg_to_arrays(msg)
    assert back.stamp_ns == 3_000_000_007 and back.frame_id == "f" and back.class_names == ["car"]
    np.testing.assert_allclose(back.boxes, dets.boxes, atol=1e-6)
    np.testing.assert_allclose(back.scores, [0.77], atol=1e-6)
    markers = ros_msgs.detections_to_markers(dets, msg.header)
    assert [m.action for m in markers.markers][0] == 3  # DELETEALL
    assert len(markers.markers) == 3
