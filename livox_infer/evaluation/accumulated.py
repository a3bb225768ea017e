"""AP of single frames vs accumulated frames on simulated drives (`livox-infer eval --sim-frames N --sim-accumulate K`).

Each evaluated frame is the last of a short simulated drive of TRACK_WARMUP + K frames (same scene, the sensor moving
as --sim-option says). Four inputs are scored against the same ground truth (the last frame's boxes and point
counts): the last frame alone, the last K frames stacked with the simulator's poses (motion-compensated by
`livox_infer.accumulate.Accumulator`), the same K frames stacked without poses (plain), and the stack with poses as
the node builds it with tracking on: every frame of the drive stacked, its moving objects' older points moved along
the tracker's velocities (`livox_infer.accumulate.compensate_object_motion`), detected and tracked in turn.

Not deskewed here: the simulator's box is where the object appears in the raw (not deskewed) cloud
(docs/simulator.md, "Time convention"); every raw frame carries the same in-frame skew, so older frames moved by
their poses land on the newest raw frame. (The node deskews with odometry and point times: its boxes are then at
the pose of the stamp.)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from livox_infer.accumulate import Accumulator
from livox_infer.errors import ConfigError
from livox_infer.decode.pointcloud import Cloud

MODES = ("single", "accumulated", "accumulated, no poses", "accumulated + track motion")
TRACK_WARMUP = 5  # frames before the evaluated stack: the tracker's tracks and velocities settle


def drive(sensor: str, seed: int, scene: str, frames: int, sim_options: dict) -> list:
    """``frames`` consecutive SimFrames of one scene (frame_index 0 .. frames - 1)."""
    from livox_infer.sim.simulate import simulate_frame

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [simulate_frame(sensor, seed, frame_index=k, scene=scene, **sim_options) for k in range(frames)]


def _cloud(frame) -> Cloud:
    """The frame's real returns (a (0,0,0) no-return moved by a pose would become a point), without point times
    (no deskew: see the module docstring)."""
    valid = frame.valid
    return Cloud(np.ascontiguousarray(frame.points[valid]), None, frame.tag[valid], int(round(frame.stamp * 1e9)),
                 "sensor")


def mode_inputs(frames: list, k: int) -> dict[str, Cloud]:
    """The detector inputs of the first three modes for one drive (see the module docstring)."""
    with_poses, plain = Accumulator(k), Accumulator(k)
    for f in frames:
        stacked = with_poses.add(_cloud(f), f.pose)
        stacked_plain = plain.add(_cloud(f))
    return {"single": _cloud(frames[-1]), "accumulated": stacked, "accumulated, no poses": stacked_plain}


def tracked_stack_detections(pipe, frames: list, k: int):
    """The last frame's detections of "accumulated + track motion": the drive's frames stacked with poses, each
    stack's moving objects compensated with the tracker's prediction, detected, then tracked (as the node does)."""
    from livox_infer.accumulate import compensate_object_motion
    from livox_infer.params import DEFAULTS
    from livox_infer.tracking import Tracker, TrackerConfig, candidates_of

    acc = Accumulator(k)
    tracker = Tracker(TrackerConfig.from_params(DEFAULTS), tuple(pipe.cfg.classes))
    pipe.update(candidate_score=DEFAULTS["tracking_low_score"])
    try:
        for f in frames:
            stacked = acc.add(_cloud(f), f.pose)
            stacked, _ = compensate_object_motion(stacked, *tracker.predict(stacked.stamp_ns, f.pose))
            d = pipe.detect(stacked)
            tracker.update(d.boxes, d.labels, d.scores, stacked.stamp_ns, f.pose, candidates_of(d))
    finally:
        pipe.update(candidate_score=None)
    return d


def main_accumulated(args, pipe) -> int:
    from livox_infer.evaluation.simulated import SIM_EVAL_SEED_BASE
    from livox_infer.evaluation.metrics import FrameBoxes, evaluate_by_sensor, summary_table
    from livox_infer.evaluation.options import eval_region, parse_ranges, parse_sim_options, sim_sensors

    k = int(args.sim_accumulate)
    if not 2 <= k <= 20:
        raise ConfigError(f"--sim-accumulate must be 2..20 frames, got {k}")
    sim_options = parse_sim_options(args.sim_option)
    region = eval_region(args, pipe.cfg)
    sensors = sim_sensors(args)
    dets: dict[str, dict[str, list]] = {m: {} for m in MODES}
    gts: dict[str, list] = {}
    for sensor in sensors:
        gts[sensor] = []
        for m in MODES:
            dets[m][sensor] = []
        for i in range(args.sim_frames):
            frames = drive(sensor, SIM_EVAL_SEED_BASE + args.seed * 10_007 + i, ("street", "open")[i % 2],
                           TRACK_WARMUP + k, sim_options)
            last = frames[-1]
            gts[sensor].append(FrameBoxes(last.boxes, last.labels, None, last.num_points, i))
            for mode, cloud in mode_inputs(frames, k).items():
                pipe.reset_ground()
                d = pipe.detect(cloud)
                dets[mode][sensor].append(FrameBoxes(d.boxes, d.labels, d.scores, None, i))
            pipe.reset_ground()
            d = tracked_stack_detections(pipe, frames, k)
            dets["accumulated + track motion"][sensor].append(FrameBoxes(d.boxes, d.labels, d.scores, None, i))
    out: dict[str, Any] = {"frames_per_sensor": args.sim_frames, "accumulate": k, "seed": args.seed,
                           "sim_options": sim_options, "region": list(region), "min_points": args.min_points}
    classes = pipe.cfg.classes
    for mode in MODES:
        per = evaluate_by_sensor(dets[mode], gts, classes, args.min_points, region, ranges=parse_ranges(args.ranges))
        print(summary_table(per, f"== {mode} ({k} frames): {args.sim_frames} simulated drives per sensor, AP R40, "
                                 f"GT of the last frame, < {args.min_points} points ignored =="))
        out[mode] = {s: r.to_dict() for s, r in per.items()}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    return 0
