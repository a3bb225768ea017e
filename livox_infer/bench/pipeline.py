"""`livox-infer bench pipeline`: decode -> voxelize -> network -> boxes on simulated Avia frames.

Frames come from the simulator (one drive, so the mount is fixed), encoded as Livox PointCloud2
("livox" layout: x y z intensity tag line timestamp, no-returns included as the driver sends them).
Each mode (eager, compiled, aoti = an AOTInductor package from `livox-infer export`) builds its own DetectionPipeline, warms up, then times every stage of
``iters`` calls; the table shows p50 / p99 in milliseconds. On CUDA the compiled mode uses CUDA graphs
(mode="reduce-overhead").
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
import torch

from livox_infer.errors import LivoxInferError

STAGES = ("decode", "ground", "voxelize", "network", "refine", "postprocess", "total")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="lite")
    p.add_argument("--weights", default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--sensor", default="avia")
    p.add_argument("--frames", type=int, default=10, help="distinct simulated frames (cycled)")
    p.add_argument("--iters", type=int, default=100, help="timed calls per mode")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--sensor-height", default="auto", help="metres or 'auto' (ground estimated per frame)")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled, aoti")
    p.add_argument("--aoti-package", default=None, help="package from `livox-infer export` for the aoti mode")
    p.add_argument("--test-time-flip", action="store_true", help="frame + mirror image through the network")
    p.add_argument("--no-refine", action="store_true", help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bev-extent", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"), default=None,
                   help="run on this grid (a preset's bev_extent) instead of the model's")


def make_messages(sensor: str, n: int, seed: int):
    from livox_infer.pointcloud import encode_pointcloud2
    from livox_infer.sim.simulate import simulate_drive

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        frames = simulate_drive(sensor, seed=seed, n_frames=n, speed_mps=8.0)
    msgs = [
        encode_pointcloud2(f.points, "livox", time=f.time, tag=f.tag, line=f.line,
                           stamp_ns=int(round(f.stamp * 1e9)), frame_id="livox_frame")
        for f in frames
    ]
    return msgs, frames[0].sensor_height, int(frames[0].points.shape[0])


def run_mode(msgs, mode: str, args, sensor_height) -> tuple[dict[str, np.ndarray], object]:
    from livox_infer.pipeline import DetectionPipeline

    t0 = time.perf_counter()
    pipe = DetectionPipeline(args.model, weights=args.weights, device=args.device, compile=(mode == "compiled"),
                             sensor_height=sensor_height, aoti_package=args.aoti_package if mode == "aoti" else None,
                             test_time_flip=args.test_time_flip, refine=not args.no_refine,
                             bev_extent=args.bev_extent)
    setup_s = time.perf_counter() - t0
    if mode == "compiled" and not pipe.compiled:
        print(f"compiled mode fell back to eager: {pipe.compile_error}", file=sys.stderr)
    for i in range(args.warmup):
        pipe.detect(msgs[i % len(msgs)])
    rows = {k: [] for k in STAGES}
    n_boxes = 0
    for i in range(args.iters):
        det = pipe.detect(msgs[i % len(msgs)])
        n_boxes += len(det)
        for k in STAGES:
            rows[k].append(det.timings_ms[k])
    return {k: np.asarray(v) for k, v in rows.items()}, (pipe, setup_s, n_boxes / max(1, args.iters))


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        msgs, height, n_points = make_messages(args.sensor, args.frames, args.seed)
        sh = args.sensor_height if args.sensor_height == "auto" else float(args.sensor_height)
        results = {}
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            if mode not in ("eager", "compiled", "aoti"):
                print(f"unknown mode {mode!r}", file=sys.stderr)
                return 2
            if mode == "aoti" and not args.aoti_package:
                print("mode aoti needs --aoti-package (make one with `livox-infer export`)", file=sys.stderr)
                return 2
            results[mode] = run_mode(msgs, mode, args, sh)
    except LivoxInferError as exc:
        print(f"livox-infer bench pipeline: {exc}", file=sys.stderr)
        return 2
    pipe = next(iter(results.values()))[1][0]
    print(f"pipeline bench: model {pipe.cfg.name} grid {pipe.cfg.grid.shape} on {pipe.device} "
          f"({torch.get_num_threads()} threads), {args.sensor} frames of {n_points} points "
          f"(Livox PointCloud2), sensor_height {args.sensor_height} (true {height:.2f} m), {args.iters} calls")
    CELL = max(len(s) for s in STAGES) + 6  # widest "<stage> p50" plus a gap
    header = f"{'mode':<10}" + "".join(f"{s + ' p50':>{CELL}}{'p99':>7}" for s in STAGES) + f"{'setup s':>9}{'boxes':>7}"
    print(header)
    for mode, (rows, (p, setup_s, boxes)) in results.items():
        label = mode + ("*" if mode == "compiled" and not p.compiled else "")
        cells = "".join(f"{np.percentile(rows[s], 50):>{CELL}.2f}{np.percentile(rows[s], 99):>7.2f}" for s in STAGES)
        print(f"{label:<10}{cells}{setup_s:>9.1f}{boxes:>7.1f}")
    if any(mode == "compiled" and not p.compiled for mode, (_, (p, _, _)) in results.items()):
        print("* compilation failed; these numbers are eager")
    return 0
