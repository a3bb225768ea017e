"""`livox-infer bench pipeline`: decode -> voxelize -> network -> boxes on simulated Avia frames.

Frames come from the simulator (one drive, so the mount is fixed), encoded as Livox PointCloud2
("livox" layout: x y z intensity tag line timestamp, no-returns included as the driver sends them).
Each mode (eager, compiled = torch.compile, aoti = an AOTInductor package: --aoti-package, else the one built for
this machine by `make package` / `livox-infer export --install`) builds its own
DetectionPipeline, warms up, then times every stage of ``iters`` calls; the table shows p50 / p99 in
milliseconds. ``--load N`` times every mode a second time with N busy processes beside it (a robot's
CPU is never idle), so the rows under contention sit next to the quiet ones. On CUDA the compiled
mode uses CUDA graphs (mode="reduce-overhead"). ``--tracking`` also runs the node's tracker after every frame
(default tracking parameters, 100 ms stamps) and adds its time and the total with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np
import torch

from livox_infer.bench.load import busy_processes, process_count
from livox_infer.bench.table import format_table
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.params import add_cli_options, parse_sensor_height
from livox_infer.threads import apply_threads

STAGES = ("decode", "ground", "voxelize", "network", "refine", "postprocess", "total")
TRACK_STAGES = ("track", "total + track")
MODES = ("eager", "compiled", "aoti")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_cli_options(p, ("model", "weights", "device", "precision", "sensor", "sensor_height", "threads"),
                    helps={"sensor": "simulated sensor of the timed frames (default %(default)s)"})
    p.add_argument("--frames", type=int, default=10, help="distinct simulated frames (cycled)")
    p.add_argument("--iters", type=int, default=100, help="timed calls per mode")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled, aoti")
    p.add_argument("--aoti-package", default=None, help="package from `livox-infer export` for the aoti mode "
                   "(default: the one built for this machine, model and grid; `make package`)")
    p.add_argument("--test-time-flip", action="store_true", help="frame + mirror image through the network")
    p.add_argument("--no-refine", action="store_true", help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--load", type=process_count, default=0, metavar="N",
                   help="also time every mode with N busy processes beside it (started and stopped by the bench)")
    p.add_argument("--tracking", action="store_true",
                   help="also time the tracker after every frame (the node's default tracking settings)")
    p.add_argument("--interleave", action="store_true",
                   help="build every mode's pipeline first, then call them in turn (one frame each per round), so "
                        "that the machine's speed changing during the run falls on all modes alike")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bev-extent", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"), default=None,
                   help="run on this grid (a preset's bev_extent) instead of the model's")


def make_messages(sensor: str, n: int, seed: int):
    from livox_infer.decode.pointcloud import encode_pointcloud2
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


def build_pipeline(mode: str, args, sensor_height):
    """(pipeline, setup seconds) for one mode."""
    from livox_infer.pipeline import DetectionPipeline

    t0 = time.perf_counter()
    # compiled = torch.compile, never a package; aoti = the named package, else the one built for this machine
    package = (args.aoti_package or None) if mode == "aoti" else False
    pipe = DetectionPipeline(args.model, weights=args.weights, device=args.device, compile=(mode != "eager"),
                             sensor_height=sensor_height, aoti_package=package,
                             test_time_flip=args.test_time_flip, refine=not args.no_refine,
                             bev_extent=args.bev_extent, precision=args.precision)
    setup_s = time.perf_counter() - t0
    if mode == "aoti" and pipe.network_backend != "aoti":
        raise ConfigError(f"mode aoti: no package ({'; '.join(pipe.startup.notes)}); give --aoti-package or run "
                          "`make package`")
    if mode == "compiled" and not pipe.compiled:
        print(f"compiled mode fell back to eager: {pipe.compile_error}", file=sys.stderr)
    return pipe, setup_s


def _tracker(pipe):
    from livox_infer.tracking import Tracker, TrackerConfig

    return Tracker(TrackerConfig(), tuple(pipe.cfg.classes))  # the node's defaults (params.TRACKER_DEFAULTS)


class _Timed:
    """One pipeline's timed calls: each `step` detects the next message (and runs the tracker after it, frames 100 ms
    apart, with ``args.tracking``, as the node does) and records its per-stage milliseconds when ``timed``."""

    def __init__(self, pipe, msgs, args) -> None:
        self.pipe, self.msgs, self.i, self.stamp, self.n_boxes = pipe, msgs, 0, 0, 0
        self.tracker = _tracker(pipe) if getattr(args, "tracking", False) else None
        if self.tracker is not None:  # the node's second association: low-scored boxes too
            from livox_infer.params import DEFAULTS

            pipe.update(candidate_score=DEFAULTS["tracking_low_score"])
        self.rows = {k: [] for k in STAGES + (TRACK_STAGES if self.tracker is not None else ())}

    def step(self, timed: bool) -> None:
        from livox_infer.tracking import candidates_of

        det = self.pipe.detect(self.msgs[self.i % len(self.msgs)])
        self.i += 1
        track_ms = 0.0
        if self.tracker is not None:
            self.stamp += 100_000_000
            t0 = time.perf_counter()
            self.tracker.update(det.boxes, det.labels, det.scores, self.stamp, candidates=candidates_of(det))
            track_ms = (time.perf_counter() - t0) * 1e3
        if not timed:
            return
        self.n_boxes += len(det)
        for k in STAGES:
            self.rows[k].append(det.timings_ms[k])
        if self.tracker is not None:
            self.rows["track"].append(track_ms)
            self.rows["total + track"].append(det.timings_ms["total"] + track_ms)

    def result(self) -> tuple[dict[str, np.ndarray], float]:
        calls = max(1, len(self.rows["total"]))
        return {k: np.asarray(v) for k, v in self.rows.items()}, self.n_boxes / calls


def time_pipeline(pipe, msgs, args) -> tuple[dict[str, np.ndarray], float]:
    """Per-stage milliseconds of ``args.iters`` calls after ``args.warmup`` untimed ones; mean boxes per frame.
    With ``args.tracking`` the tracker runs after each call (frames 100 ms apart), as the node does."""
    return time_interleaved([pipe], msgs, args)[0]


def time_interleaved(pipes, msgs, args) -> list[tuple[dict[str, np.ndarray], float]]:
    """`time_pipeline` of several pipelines with their calls taken in turn (one call of each, then the next round),
    so that a change in the machine's speed during the run (other tenants of a VM, turbo) falls on all of them."""
    timers = [_Timed(pipe, msgs, args) for pipe in pipes]
    for timed, rounds in ((False, args.warmup), (True, args.iters)):
        for _ in range(rounds):
            for t in timers:
                t.step(timed)
    return [t.result() for t in timers]


def _ratios(rows: list[list], modes: list[str], loads: list[int]) -> list[str]:
    """"total p50 / eager's" per mode and load, when eager was timed."""
    p50 = {(r[0].rstrip("*"), r[2]): float(r[3 + STAGES.index("total")].split("/")[0]) for r in rows}
    out = []
    for load in loads:
        eager = p50.get(("eager", load))
        if eager:
            out.append(f"load {load}: " + ", ".join(f"{m} {p50[(m, load)] / eager:.2f}" for m in modes
                                                     if m != "eager" and (m, load) in p50))
    return out


def parse_modes(text: str, aoti_package: str | None) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; use {', '.join(MODES)}")
    return modes


def main(args: argparse.Namespace) -> int:
    apply_threads(args.threads)  # again for a direct call of main() (cli.main applies it first)
    loads = [0] + ([args.load] if args.load else [])
    load_before = os.getloadavg()[0]
    rows = []
    stages = STAGES + (TRACK_STAGES if args.tracking else ())
    try:
        modes = parse_modes(args.modes, args.aoti_package)
        msgs, height, n_points = make_messages(args.sensor, args.frames, args.seed)
        sh = parse_sensor_height(args.sensor_height)
        def row(label, load, timings, boxes, setup_s):
            return ([label, torch.get_num_threads(), load]
                    + [f"{np.percentile(timings[s], 50):.2f} / {np.percentile(timings[s], 99):.2f}" for s in stages]
                    + [f"{setup_s:.1f}", f"{boxes:.1f}"])

        def label(mode, pipe):
            return mode + ("*" if mode == "compiled" and not pipe.compiled else "")

        if args.interleave:  # all pipelines first, then their calls in turn
            built = [(mode, *build_pipeline(mode, args, sh)) for mode in modes]
            for load in loads:
                with busy_processes(load):
                    results = time_interleaved([pipe for _, pipe, _ in built], msgs, args)
                for (mode, pipe, setup_s), (timings, boxes) in zip(built, results):
                    rows.append(row(label(mode, pipe), load, timings, boxes, setup_s))
            pipe = built[-1][1]
        else:
            for mode in modes:
                pipe, setup_s = build_pipeline(mode, args, sh)
                for load in loads:
                    with busy_processes(load):
                        timings, boxes = time_pipeline(pipe, msgs, args)
                    rows.append(row(label(mode, pipe), load, timings, boxes, setup_s))
    except LivoxInferError as exc:
        print(f"livox-infer bench pipeline: {exc}", file=sys.stderr)
        return 2
    print(f"pipeline bench: model {pipe.cfg.name} grid {pipe.cfg.grid.shape} on {pipe.device} ({pipe.precision}), "
          f"{args.sensor} frames of {n_points} points (Livox PointCloud2), sensor_height {args.sensor_height} "
          f"(true {height:.2f} m), {args.iters} calls per row; {os.cpu_count()} cores, load average "
          f"{load_before:.2f} before the run")
    print("ms p50 / p99 per stage; load = busy processes started by the bench beside it")
    header = ["mode", "threads", "load"] + [f"{s} p50 / p99" for s in stages] + ["setup s", "boxes"]
    print(format_table(header, rows))
    ratios = _ratios(rows, modes, loads)
    if ratios:
        print(f"total p50 / eager's ({'calls interleaved' if args.interleave else 'modes one after another'}): "
              + "; ".join(ratios))
    if any(r[0].endswith("*") for r in rows):
        print("* compilation failed; these numbers are eager")
    return 0
