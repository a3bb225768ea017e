"""AP of single frames vs accumulated frames on simulated drives (`livox-infer eval --sim-frames N --sim-accumulate K`).

Each evaluated frame is the K-th frame of a short simulated drive (same scene, the sensor moving as --sim-option
says). Three inputs are scored against the same ground truth (the last frame's boxes and point counts):
the last frame alone, the last K frames stacked with the simulator's poses (motion-compensated by
`livox_infer.accumulate.Accumulator`), and the same K frames stacked without poses (plain).

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

MODES = ("single", "accumulated", "accumulated, no poses")


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
    """The three detector inputs of one drive (see the module docstring)."""
    with_poses, plain = Accumulator(k), Accumulator(k)
    for f in frames:
        stacked = with_poses.add(_cloud(f), f.pose)
        stacked_plain = plain.add(_cloud(f))
    return {"single": _cloud(frames[-1]), "accumulated": stacked, "accumulated, no poses": stacked_plain}


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
            frames = drive(sensor, SIM_EVAL_SEED_BASE + args.seed * 10_007 + i, ("street", "open")[i % 2], k,
                           sim_options)
            last = frames[-1]
            gts[sensor].append(FrameBoxes(last.boxes, last.labels, None, last.num_points, i))
            for mode, cloud in mode_inputs(frames, k).items():
                pipe.reset_ground()
                d = pipe.detect(cloud)
                dets[mode][sensor].append(FrameBoxes(d.boxes, d.labels, d.scores, None, i))
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
