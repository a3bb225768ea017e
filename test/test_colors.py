"""One class-colour table (livox_infer/colors.py) for the RViz markers and the BEV pictures; the pictures have a
legend and readable labels."""

from __future__ import annotations

import numpy as np
import pytest

from livox_infer import CLASS_NAMES, colors


def test_markers_and_bev_pictures_use_the_one_table():
    from livox_infer.ros import messages
    from livox_infer.tools import bev_plot

    assert messages.CLASS_COLORS is colors.CLASS_COLORS and bev_plot.CLASS_COLORS is colors.CLASS_COLORS
    assert set(CLASS_NAMES) <= set(colors.CLASS_COLORS)
    assert colors.class_color_hex("car") == "#1a8cff" and colors.class_color("tractor") == colors.UNKNOWN_COLOR


def test_a_car_marker_has_the_tables_car_colour():
    pytest.importorskip("visualization_msgs.msg")
    from livox_infer.ros.messages import detections_to_markers
    from test_node_support import FakeDetections

    dets = FakeDetections(np.array([[10, 0, 0, 4, 2, 1.5, 0], [5, 2, 0, 0.6, 0.6, 1.7, 0]], np.float32),
                          np.array([0, 1]), np.array([0.9, 0.8], np.float32), ["car", "pedestrian"])
    markers = detections_to_markers(dets, stamp_ns=1, frame_id="f").markers
    edges = [m for m in markers if m.ns.endswith("/boxes")]
    for marker, name in zip(edges, ("car", "pedestrian")):
        rgba = (marker.color.r, marker.color.g, marker.color.b, marker.color.a)
        assert rgba == pytest.approx(colors.CLASS_COLORS[name])


def test_bev_picture_draws_each_class_in_its_colour_with_a_legend(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from livox_infer.tools.bev_plot import legend_handles, save_bev_png

    rng = np.random.default_rng(0)
    points = np.concatenate([rng.uniform([0, -20, -1.5], [40, 20, 1.0], (3000, 3)), np.zeros((3000, 1))], 1)
    boxes = np.array([[20, 0, 0, 4.5, 2.0, 1.5, 0.3], [10, 8, 0, 0.8, 0.8, 1.8, 0.0], [30, -8, 0, 1.8, 0.7, 1.7, 1.0],
                      [15, -14, 0, 8.0, 2.4, 3.4, 0.0], [32, 12, 0, 11.5, 2.5, 3.1, 0.1]])
    names = ["car", "pedestrian", "cyclist", "truck", "bus"]
    path = tmp_path / "bev.png"
    save_bev_png(path, points.astype(np.float32), boxes, names, np.array([0.9, 0.5, 0.7, 0.8, 0.6]),
                 (0, 40, -20, 20), title="t")
    img = imread(path)[..., :3]
    for name in names:  # the outline's exact colour is in the picture
        want = np.array(colors.CLASS_COLORS[name][:3])
        assert (np.abs(img - want).max(axis=-1) < 0.02).sum() > 20, name
    labels = [h.get_label() for h in legend_handles(with_labels=True)]
    assert labels[:5] == list(colors.CLASS_COLORS) and "labelled (dashed)" in labels
