"""`livox-infer eval --confusion`: what became of each labelled object (right, called another class, poorly
placed, no box), on hand-made boxes and through the CLI on simulated frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from livox_infer.errors import ConfigError
from livox_infer.evaluation.confusion import confusion_table, object_outcomes
from livox_infer.evaluation.metrics import FrameBoxes
from livox_infer.tools.cli import main as cli_main

CLASSES = ("car", "pedestrian", "cyclist", "truck", "bus")


def _box(x, y, l, w, yaw=0.0, h=1.6):
    return [x, y, 0.0, l, w, h, yaw]


def test_each_object_gets_one_outcome():
    gt = FrameBoxes(np.array([
        _box(10, 0, 4.5, 1.9),        # car: a car box 0.5 m off along it (IoU 0.8): right
        _box(20, 5, 16.5, 2.6),       # truck: boxed well, as a bus: called bus
        _box(30, -5, 0.6, 0.6),       # pedestrian: a pedestrian box 0.45 m off (IoU ~0.14): poorly placed
        _box(40, 0, 1.8, 0.6),        # cyclist: nothing near: no box
        _box(15, -8, 4.5, 1.9),       # car, ignored (too few points): not counted
        _box(50, 8, 4.5, 1.9),        # car: a car box at IoU ~0.3 and a truck box at IoU ~0.9: called truck
    ]), np.array([0, 3, 1, 2, 0, 0]))
    ignore = np.array([False, False, False, False, True, False])
    det = FrameBoxes(np.array([
        _box(10.5, 0, 4.5, 1.9),
        _box(20.2, 5, 16.0, 2.6),
        _box(30.45, -5, 0.6, 0.6),
        _box(15, -8, 4.5, 1.9),       # on the ignored car
        _box(52.0, 8, 4.5, 1.9),
        _box(50.1, 8, 4.6, 1.9),
    ]), np.array([0, 4, 1, 0, 0, 3]), np.array([0.9, 0.8, 0.5, 0.9, 0.6, 0.7]))
    res = object_outcomes([det], [gt], [ignore], CLASSES)
    assert res["car"] == {"objects": 2, "right": 1, "called truck": 1, "poorly placed": 0, "no box": 0}
    assert res["truck"] == {"objects": 1, "right": 0, "called bus": 1, "poorly placed": 0, "no box": 0}
    assert res["pedestrian"] == {"objects": 1, "right": 0, "poorly placed": 1, "no box": 0}
    assert res["cyclist"] == {"objects": 1, "right": 0, "poorly placed": 0, "no box": 1}
    assert res["bus"]["objects"] == 0
    table = confusion_table(res, "t")
    assert "called truck" in table and "called bus" in table
    assert [line.split()[0] for line in table.splitlines()[3:]] == ["car", "pedestrian", "cyclist", "truck"]
    # a frame without detections: every object not boxed
    empty = FrameBoxes(np.zeros((0, 7)), np.zeros(0, np.int64), np.zeros(0))
    assert object_outcomes([empty], [gt], [ignore], CLASSES)["car"]["no box"] == 2


def test_eval_sim_confusion_accounts_for_every_object(tmp_path, capsys):
    """Every object the AP counts is in exactly one column; the table is printed and in the JSON."""
    out = tmp_path / "res.json"
    rc = cli_main(["eval", "--sim-frames", "2", "--sensors", "avia", "--seed", "4", "--no-compile", "--confusion",
                   "--sim-option", "large_vehicles=3", "--out", str(out)])
    assert rc == 0
    assert "labelled objects on the simulated frames" in capsys.readouterr().out
    res = json.loads(out.read_text())
    conf, num_gt = res["confusion"], res["model lite"]["all"]["num_gt"]
    for c in CLASSES:
        assert conf[c]["objects"] == num_gt[c]
        assert sum(v for k, v in conf[c].items() if k != "objects") == conf[c]["objects"]
    assert conf["car"]["objects"] > 0 and conf["car"]["right"] > 0


def test_eval_confusion_needs_frames_it_can_score(capsys):
    assert cli_main(["eval", "--sim-frames", "1", "--sensors", "avia", "--no-compile", "--tracking",
                     "--confusion"]) == 2
    assert "--confusion works with" in capsys.readouterr().err
