"""Accumulation on simulated drives: the simulator's poses make static objects coincide across frames;
`livox-infer eval --sim-accumulate` scores single vs accumulated frames."""

import argparse

import numpy as np
import torch

from livox_infer.evaluation.accumulated import _cloud, drive, mode_inputs
from livox_infer.evaluation import evaluate as evaluate_cli

torch.set_num_threads(1)


def object_centre(cloud, frame, object_id):
    """Mean position of the points of one object (by its drive-stable id) inside ``cloud``'s first points."""
    idx = int(np.flatnonzero(frame.object_ids == object_id)[0])
    mask = frame.instance[frame.valid] == idx
    return cloud.points[: int(frame.valid.sum())][mask, :3].mean(0) if mask.sum() >= 10 else None


def test_poses_of_a_simulated_drive_stack_static_objects_on_top_of_each_other():
    frames = drive("avia", seed=11, scene="street", frames=2, sim_options={"ego_speed": 12.0, "moving": False})
    first, last = frames
    stacked = mode_inputs(frames, 2)
    # frame 0's points come first in the stacked clouds; compare each parked car's centre with frame 1's own view
    moved_err, plain_err = [], []
    for oid in set(first.object_ids) & set(last.object_ids):
        now = object_centre(_cloud(last), last, oid)
        then_moved = object_centre(stacked["accumulated"], first, oid)
        then_plain = object_centre(stacked["accumulated, no poses"], first, oid)
        if now is None or then_moved is None:
            continue
        moved_err.append(np.linalg.norm((then_moved - now)[:2]))
        plain_err.append(np.linalg.norm((then_plain - now)[:2]))
    # the visible part of a car shifts a little with the viewpoint (median 0.10-0.20 m over scene versions);
    # without poses the 1.2 m driven shows
    assert len(moved_err) >= 5
    assert np.median(moved_err) < 0.3 and max(moved_err) < 0.8, moved_err  # max: a car half hidden in one view
    assert np.median(plain_err) > 1.0, plain_err


def test_eval_sim_accumulate_prints_single_and_accumulated(capsys, tmp_path):
    p = argparse.ArgumentParser()
    evaluate_cli.add_arguments(p)
    args = p.parse_args(["--sim-frames", "1", "--sim-accumulate", "2", "--sensor", "mid40", "--no-compile",
                         "--device", "cpu", "--out", str(tmp_path / "acc.json")])
    assert evaluate_cli.main(args) == 0
    out = capsys.readouterr().out
    assert "== single (2 frames)" in out and "== accumulated (2 frames)" in out and "no poses" in out
    assert "== accumulated + track motion (2 frames)" in out
    assert (tmp_path / "acc.json").is_file()
