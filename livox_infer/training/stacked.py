"""Stacked training samples: K consecutive simulated frames of one drive, as the node's ``accumulate_frames`` stacks
them (issue 32).

The frames are stacked by `livox_infer.accumulate.Accumulator` with the simulator's poses (the node's odometry),
so a moving object leaves a trail of its earlier positions; the labels are the newest frame's boxes, and each
point carries its age (seconds before the newest frame), which a model with ``grid.age_channel_s`` sees as an
input channel and so learns which part of a trail is the object now. Not deskewed, as in
`livox_infer.evaluation.accumulated`: the simulator's boxes are where the objects appear in the raw frame. Every
second sample (odd seeds) takes its ages from the point times, as a cloud with per-point times gives them (a point
of the previous frame is 0-100 ms old); the others one age per frame, as clouds without point times give them.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from livox_infer.accumulate import Accumulator, point_ages
from livox_infer.decode.pointcloud import Cloud
from livox_infer.training.frame import Frame, sim_returns, training_mount


def simulate_stacked_frame(sensor: str, seed: int, kind: str, frames: int, **sim_options: Any) -> Frame:
    """Frames 0 .. ``frames`` - 1 of the simulated drive (scene ``kind``, ``seed``) stacked into the newest one's
    sensor frame (`Frame.age` set); ``frames`` = 1 gives the single frame with ages 0."""
    from livox_infer.sim.simulate import simulate_frame

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        drive = [simulate_frame(sensor, seed, frame_index=k, scene=kind, **sim_options) for k in range(frames)]
    acc = Accumulator(frames)
    in_frame: list[np.ndarray] = []
    for f in drive:
        keep = sim_returns(f)
        cloud = Cloud(np.ascontiguousarray(np.asarray(f.points, np.float32)[keep]), None, None,
                      int(round(f.stamp * 1e9)), "sensor")
        stacked = acc.add(cloud, np.asarray(f.pose, np.float64))
        in_frame.append(np.asarray(f.time, np.float64)[keep])
    newest = drive[-1]
    ages = point_ages(stacked)
    if ages is None:  # a single frame
        ages = np.zeros(len(stacked), np.float32)
    elif seed % 2:  # per-point times: a point's time is its frame's offset (-age) plus its time inside the frame
        ages = np.maximum(ages.astype(np.float64) - np.concatenate(in_frame), 0.0).astype(np.float32)
    pts = stacked.points
    est = training_mount(pts, newest)  # from the stacked cloud, as the pipeline levels it
    return Frame(np.ascontiguousarray(pts), np.asarray(newest.boxes, np.float32).reshape(-1, 7),
                 np.asarray(newest.labels, np.int64), est.height, np.asarray(est.up, np.float32), sensor,
                 np.ascontiguousarray(ages, dtype=np.float32))
