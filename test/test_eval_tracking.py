"""`livox-infer eval --tracking`: the CLEAR-MOT scorer on hand-made frames, and the command on simulated drives."""

import json

import numpy as np
import pytest

from livox_infer.evaluation.tracking import TrackingScorer
from livox_infer.tools.cli import main as cli_main
from livox_infer.tracking import TrackFrame


def _tracks(ids, xys, labels=None, vel=None):
    n = len(ids)
    boxes = np.zeros((n, 7), np.float32)
    if n:
        boxes[:, :2] = np.asarray(xys, np.float32)
    return TrackFrame(detection_track_ids=np.zeros(0, np.int64), track_ids=np.asarray(ids, np.int64),
                      boxes=boxes, labels=np.zeros(n, np.int64) if labels is None else np.asarray(labels),
                      scores=np.ones(n, np.float32),
                      velocities=np.zeros((n, 2), np.float32) if vel is None else np.asarray(vel, np.float32),
                      yaw_rates=np.zeros(n, np.float32), ages=np.ones(n, np.int64), ego_motion=True)


def _gt(xys):
    boxes = np.zeros((len(xys), 7))
    boxes[:, :2] = xys
    return boxes


def test_scorer_counts_misses_false_positives_switches_and_velocity_error():
    s = TrackingScorer(("car", "pedestrian", "cyclist"), min_points=5, region=(0, 100, -50, 50))
    gt_ids, gt_vel, pts = [7, 8], [[5.0, 0.0], [0.0, 0.0]], [50, 50]
    # frame 0: both found (tracks 1, 2); frame 1: object 7 taken by track 3 (a switch), 8 missed, one false track
    s.add_frame(0, _gt([[10, 0], [20, 5]]), [0, 0], gt_ids, gt_vel, pts,
                _tracks([1, 2], [[10.2, 0], [20, 5]], vel=[[4.0, 0.0], [0.0, 0.0]]))
    s.add_frame(0, _gt([[10.5, 0], [20, 5]]), [0, 0], gt_ids, gt_vel, pts,
                _tracks([3, 4], [[10.5, 0], [40, 5]], vel=[[5.0, 0.0], [0.0, 0.0]]))
    # frame 2: object 8 has too few points (ignored): the track on it is no false positive, its absence no miss
    s.add_frame(0, _gt([[11.0, 0], [20, 5]]), [0, 0], gt_ids, gt_vel, [50, 2],
                _tracks([3, 9], [[11.0, 0], [20, 5]]))
    car = s.result()["car"]
    assert (car["gt_boxes"], car["matches"], car["misses"], car["false_positives"], car["id_switches"]) == (5, 4, 1, 1, 1)
    assert car["mota"] == pytest.approx(1 - 3 / 5)
    assert car["gt_tracks"] == 2 and car["id_switches_per_100_tracks"] == pytest.approx(50.0)
    assert car["velocity_error_median"] == pytest.approx(0.5)  # errors 1, 0 (frame 0), 0 (frame 1), 5 (frame 2)
    assert s.result()["pedestrian"]["gt_boxes"] == 0


def test_scorer_keeps_a_correspondence_that_still_holds():
    """A nearer new track does not take over an object its track still follows (no false switch)."""
    s = TrackingScorer(("car",), min_points=0, region=None)
    s.add_frame(0, _gt([[10, 0]]), [0], [1], [[0, 0]], [9], _tracks([1], [[11.5, 0]]))
    s.add_frame(0, _gt([[10, 0]]), [0], [1], [[0, 0]], [9], _tracks([1, 2], [[11.5, 0], [10.1, 0]]))
    car = s.result()["car"]
    assert car["id_switches"] == 0 and car["false_positives"] == 1


def test_eval_tracking_command_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "trk.json"
    rc = cli_main(["eval", "--tracking", "--sim-frames", "6", "--sim-sequences", "1", "--sensors", "avia",
                   "--no-compile", "--threads", "1", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["conditions"]) == {"standing", "moving"}
    assert res["score_threshold"] == "config"  # tracks are made from what the node publishes
    for cond in res["conditions"].values():
        car = cond["classes"]["car"]
        assert car["gt_boxes"] > 0 and car["matches"] > 0 and 0.0 < car["mota"] <= 1.0
        assert car["velocity_pairs"] == car["matches"] and np.isfinite(car["velocity_error_median"])
    assert res["conditions"]["moving"]["sim_options"]["ego_speed"] == [5.0, 15.0]
    text = capsys.readouterr().out
    assert "== tracking: 1 sequences x 6 frames" in text and "moving     car" in text


def test_eval_tracking_needs_sim_frames(capsys):
    assert cli_main(["eval", "--tracking", "--no-compile"]) == 2
    assert "--tracking needs --sim-frames" in capsys.readouterr().err
