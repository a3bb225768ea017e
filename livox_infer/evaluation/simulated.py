"""Evaluation inputs: held-out simulated frames, ground truth from bags, a pipeline as a detect function."""

from __future__ import annotations

from typing import Sequence


from livox_infer import CLASS_NAMES
from livox_infer.detector.boxes import points_in_boxes
from livox_infer.evaluation.metrics import DEFAULT_MIN_POINTS, EvalResult, FrameBoxes
from livox_infer.evaluation.metrics import evaluate_by_sensor


SIM_EVAL_SEED_BASE = 50_000_000  # disjoint from the training (1e6..) and validation (9e6..) seeds


def simulated_eval_frames(sensor: str, n: int, seed: int = 0, sim_options: dict | None = None):
    """n held-out simulated frames of ``sensor`` (street/open alternating): [(points (N,4), GT FrameBoxes)].

    GT num_points is the simulator's count of returns on each object; points keep the driver's
    (0,0,0) no-returns (the pipeline drops them)."""
    import warnings

    from livox_infer.sim.simulate import simulate_frame

    out = []
    for i in range(n):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            f = simulate_frame(sensor, SIM_EVAL_SEED_BASE + seed * 10_007 + i, scene=("street", "open")[i % 2],
                               **(sim_options or {}))
        out.append((f.points, FrameBoxes(f.boxes, f.labels, None, f.num_points, i)))
    return out


def evaluate_on_simulation(detect_fns: dict, sensors: Sequence[str], n: int, seed: int = 0,
                           classes: Sequence[str] = CLASS_NAMES, min_points: int = DEFAULT_MIN_POINTS,
                           region=None, metrics=("bev", "3d"),
                           sim_options: dict | None = None,
                           ranges: Sequence[float] | None = None,
                           collected: dict | None = None) -> dict[str, dict[str, EvalResult]]:
    """AP per sensor (and "all" pooled) for each named detector ``fn(points) -> (boxes, labels, scores)``;
    with ``ranges`` (bin edges in metres) also the pooled AP per range bin, keyed "all <lo>-<hi> m".
    ``collected`` (a dict) receives each detector's pooled (detections, ground truth) frame lists."""
    dets: dict[str, dict[str, list[FrameBoxes]]] = {name: {} for name in detect_fns}
    gts: dict[str, list[FrameBoxes]] = {}
    for sensor in sensors:
        frames = simulated_eval_frames(sensor, n, seed, sim_options)
        gts[sensor] = [g for _, g in frames]
        for name, fn in detect_fns.items():
            dets[name][sensor] = [FrameBoxes(*fn(pts)) for pts, _ in frames]
    if collected is not None:
        for name in detect_fns:
            collected[name] = ([d for s in sensors for d in dets[name][s]], [g for s in sensors for g in gts[s]])
    return {name: evaluate_by_sensor(dets[name], gts, classes, min_points, region, metrics, ranges)
            for name in detect_fns}


def gt_from_bag(path: str, topic: str, cloud_topic: str | None):
    from livox_infer.bags import read_clouds, read_detections

    gts = [FrameBoxes(f.boxes, f.labels, None, None, f.stamp_ns) for f in read_detections(path, topic)]
    clouds = {c.stamp_ns: c for _, c in read_clouds(path, cloud_topic)}
    for g in gts:
        cloud = clouds.get(g.stamp_ns)
        if cloud is not None:
            g.num_points = points_in_boxes(cloud.points, g.boxes)
    return gts, clouds


def scan_detector(pipe):
    """``fn(points) -> (boxes, labels, scores)`` of ``pipe`` for unrelated scans: the ground estimate of one
    scan is not smoothed with the previous ones ("auto" sensor height)."""
    def detect(points):
        pipe.reset_ground()
        d = pipe.detect(points)
        return d.boxes, d.labels, d.scores

    return detect
