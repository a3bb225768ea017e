"""Average precision (KITTI R40) per class with rotated BEV and 3D IoU; `livox-infer eval`.

Matching, per frame and class: detections in descending score order each take the unmatched
ground-truth box of highest IoU >= threshold (true positive) or count as false positives.
Ground truth with fewer than `min_points` lidar points inside (default 5; too few points to be
detectable) and ground truth outside the evaluated region is *ignored*: it is not counted as a
miss, and a detection matched to it is neither TP nor FP. Detections outside the region are dropped.
AP = mean over recall r in {1/40, 2/40, ..., 1} of the best precision at recall >= r.

Thresholds (IoU): car 0.7 / 0.5, pedestrian and cyclist 0.5 / 0.25 (strict / loose), each for BEV and 3D.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.model.boxes import bev_iou, iou_3d, points_in_boxes
from livox_infer.threads import add_threads_argument

DEFAULT_MIN_POINTS = 5
IOU_THRESHOLDS = {"car": (0.7, 0.5), "pedestrian": (0.5, 0.25), "cyclist": (0.5, 0.25)}
R40 = np.linspace(1.0 / 40, 1.0, 40)


@dataclass
class FrameBoxes:
    """Boxes of one frame: (M, 7), labels (M,) int, scores (M,) (ignored for GT), optional num_points (M,)."""

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray | None = None
    num_points: np.ndarray | None = None
    stamp_ns: int = 0

    def __post_init__(self) -> None:
        self.boxes = np.asarray(self.boxes, np.float32).reshape(-1, 7)
        self.labels = np.asarray(self.labels, np.int64).reshape(-1)
        if self.labels.shape[0] != self.boxes.shape[0]:
            raise ConfigError(f"{self.boxes.shape[0]} boxes but {self.labels.shape[0]} labels")
        n = self.boxes.shape[0]
        self.scores = np.ones(n, np.float32) if self.scores is None else np.asarray(self.scores, np.float32).reshape(-1)
        if self.num_points is not None:
            self.num_points = np.asarray(self.num_points, np.int64).reshape(-1)


def average_precision_r40(scores: np.ndarray, tp: np.ndarray, num_gt: int) -> float:
    """R40 AP of detections (scores, tp flags) pooled over frames against num_gt relevant GT boxes."""
    if num_gt == 0:
        return float("nan")
    if len(scores) == 0:
        return 0.0
    order = np.argsort(-np.asarray(scores), kind="stable")
    tp = np.asarray(tp, bool)[order]
    ctp = np.cumsum(tp)
    cfp = np.cumsum(~tp)
    recall = ctp / num_gt
    precision = ctp / np.maximum(ctp + cfp, 1)
    # Best precision at recall >= r: running max from the end.
    prec_env = np.maximum.accumulate(precision[::-1])[::-1]
    ap = 0.0
    for r in R40:
        idx = np.searchsorted(recall, r - 1e-12, side="left")
        ap += prec_env[idx] if idx < len(prec_env) else 0.0
    return float(ap / len(R40))


def match_frame(det_boxes, det_scores, gt_boxes, gt_ignore, threshold: float, metric: str = "bev"):
    """Greedy matching in one frame and class. Returns (tp (D,) bool, keep (D,) bool, num_relevant_gt).

    keep is False for detections matched to an ignored GT box (they are removed from the PR curve)."""
    d, g = det_boxes.shape[0], gt_boxes.shape[0]
    tp = np.zeros(d, bool)
    keep = np.ones(d, bool)
    relevant = int((~gt_ignore).sum())
    if d == 0:
        return tp, keep, relevant
    if g == 0:
        return tp, keep, relevant
    fn = bev_iou if metric == "bev" else iou_3d
    iou = fn(torch.from_numpy(det_boxes).double(), torch.from_numpy(gt_boxes).double()).numpy()
    used = np.zeros(g, bool)
    for i in np.argsort(-det_scores, kind="stable"):
        # prefer relevant GT, then ignored GT (which neutralises the detection)
        cand = np.where(~used & ~gt_ignore & (iou[i] >= threshold), iou[i], -1.0)
        j = int(cand.argmax())
        if cand[j] >= 0:
            used[j] = True
            tp[i] = True
            continue
        cand = np.where(gt_ignore & (iou[i] >= threshold), iou[i], -1.0)
        if cand.size and cand.max() >= 0:
            keep[i] = False
    return tp, keep, relevant


@dataclass
class EvalResult:
    ap: dict[str, dict[str, float]] = field(default_factory=dict)  # class -> {"bev@0.7": ap, ...}
    num_gt: dict[str, int] = field(default_factory=dict)  # relevant (non-ignored) GT per class
    num_ignored: dict[str, int] = field(default_factory=dict)
    num_frames: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"ap": self.ap, "num_gt": self.num_gt, "num_ignored": self.num_ignored, "num_frames": self.num_frames}

    def table(self, title: str = "") -> str:
        cols = sorted({k for v in self.ap.values() for k in v}, key=lambda k: (k.split("@")[0] != "bev", k))
        lines = [title] if title else []
        lines.append(f"{'class':<12}{'GT':>6}{'ign':>6}" + "".join(f"{c:>11}" for c in cols))
        for cls, aps in self.ap.items():
            vals = "".join(f"{aps[c]:>11.3f}" if c in aps else f"{'-':>11}" for c in cols)
            lines.append(f"{cls:<12}{self.num_gt.get(cls, 0):>6}{self.num_ignored.get(cls, 0):>6}{vals}")
        return "\n".join(lines)


def in_region(boxes: np.ndarray, region) -> np.ndarray:
    """Boxes whose centre lies inside ``region`` = (x_min, x_max, y_min, y_max) (all when region is None)."""
    boxes = np.asarray(boxes).reshape(-1, 7)
    if region is None:
        return np.ones(boxes.shape[0], bool)
    x0, x1, y0, y1 = region
    return (boxes[:, 0] >= x0) & (boxes[:, 0] < x1) & (boxes[:, 1] >= y0) & (boxes[:, 1] < y1)


def in_range_bin(boxes: np.ndarray, range_bin) -> np.ndarray:
    """Boxes whose centre lies at a BEV distance from the sensor in [lo, hi) (all when range_bin is None)."""
    boxes = np.asarray(boxes).reshape(-1, 7)
    if range_bin is None:
        return np.ones(boxes.shape[0], bool)
    r = np.hypot(boxes[:, 0], boxes[:, 1])
    return (r >= range_bin[0]) & (r < range_bin[1])


def evaluate(
    detections: Sequence[FrameBoxes], ground_truth: Sequence[FrameBoxes], classes: Sequence[str] = CLASS_NAMES,
    min_points: int = DEFAULT_MIN_POINTS, region: tuple[float, float, float, float] | None = None,
    metrics: Iterable[str] = ("bev", "3d"), range_bin: tuple[float, float] | None = None,
    gt_ignore: Sequence[np.ndarray] | None = None,
) -> EvalResult:
    """AP per class over aligned lists of frames. ``region`` = (x_min, x_max, y_min, y_max) or None.

    ``range_bin`` = (lo, hi) metres: only objects whose centre lies at that BEV distance from the sensor
    count, the way ``region`` restricts them (GT outside is ignored, detections outside are dropped),
    so a detection just inside the bin that matches a GT just outside is neither TP nor FP.
    GT ``num_points`` None means "unknown": then no GT is ignored for having few points.
    ``gt_ignore`` (one (M,) bool array per frame, or None) marks further GT boxes as ignored (e.g. a van
    for the car class: a detection on it is neither TP nor FP)."""
    if len(detections) != len(ground_truth):
        raise ConfigError(f"{len(detections)} detection frames but {len(ground_truth)} ground-truth frames")
    if gt_ignore is not None and len(gt_ignore) != len(ground_truth):
        raise ConfigError(f"{len(gt_ignore)} ignore masks but {len(ground_truth)} ground-truth frames")
    res = EvalResult(num_frames=len(ground_truth))
    for ci, cls in enumerate(classes):
        thresholds = IOU_THRESHOLDS.get(cls, (0.5, 0.25))
        res.ap[cls] = {}
        for metric in metrics:
            for thr in thresholds:
                all_scores, all_tp, n_gt, n_ign = [], [], 0, 0
                for k, (det, gt) in enumerate(zip(detections, ground_truth)):
                    gsel = gt.labels == ci
                    gb = gt.boxes[gsel]
                    ignore = ~(in_region(gb, region) & in_range_bin(gb, range_bin))
                    if gt_ignore is not None:
                        ignore |= np.asarray(gt_ignore[k], bool).reshape(-1)[gsel]
                    if gt.num_points is not None:
                        ignore |= gt.num_points[gsel] < min_points
                    dsel = (det.labels == ci) & in_region(det.boxes, region) & in_range_bin(det.boxes, range_bin)
                    db, ds = det.boxes[dsel], det.scores[dsel]
                    tp, keep, relevant = match_frame(db, ds, gb, ignore, thr, metric)
                    all_scores.append(ds[keep])
                    all_tp.append(tp[keep])
                    n_gt += relevant
                    n_ign += int(ignore.sum())
                scores = np.concatenate(all_scores) if all_scores else np.zeros(0)
                tps = np.concatenate(all_tp) if all_tp else np.zeros(0, bool)
                res.ap[cls][f"{metric}@{thr:g}"] = average_precision_r40(scores, tps, n_gt)
                res.num_gt[cls] = n_gt
                res.num_ignored[cls] = n_ign
    return res


# --------------------------------------------------------------------------- files


def _frame_from_json(obj: dict[str, Any], classes: Sequence[str]) -> FrameBoxes:
    boxes, labels, scores, npts = [], [], [], []
    for b in obj.get("boxes", []):
        name = b.get("label")
        if name not in classes:
            continue
        boxes.append([float(b[k]) for k in ("x", "y", "z", "l", "w", "h", "yaw")])
        labels.append(classes.index(name))
        scores.append(float(b.get("score", 1.0)))
        npts.append(b.get("num_points"))
    num_points = None if (not npts or any(n is None for n in npts)) else np.asarray(npts, np.int64)
    if not boxes:
        num_points = np.zeros(0, np.int64) if "boxes" in obj else None
    return FrameBoxes(np.asarray(boxes, np.float32).reshape(-1, 7), np.asarray(labels, np.int64), np.asarray(scores, np.float32),
                      num_points, int(obj.get("stamp", obj.get("stamp_ns", 0))))


def read_jsonl(path: str | Path, classes: Sequence[str] = CLASS_NAMES) -> list[FrameBoxes]:
    """Frames of a detections/labels JSONL file (one JSON object per line with ``stamp`` and ``boxes``)."""
    out = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(_frame_from_json(json.loads(line), classes))
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                        raise ConfigError(f"{path}:{n}: bad detections line: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return out


def align_frames(dets: list[FrameBoxes], gts: list[FrameBoxes]) -> tuple[list[FrameBoxes], list[FrameBoxes]]:
    """Pair detection and GT frames by stamp; GT frames without detections get an empty detection frame."""
    by_stamp = {d.stamp_ns: d for d in dets}
    empty = lambda s: FrameBoxes(np.zeros((0, 7), np.float32), np.zeros(0, np.int64), stamp_ns=s)  # noqa: E731
    paired = [by_stamp.get(g.stamp_ns, empty(g.stamp_ns)) for g in gts]
    missing = sum(g.stamp_ns not in by_stamp for g in gts)
    if missing == len(gts) and gts:
        raise ConfigError("no detection frame has the stamp of any ground-truth frame; are these the same recording?")
    return paired, gts


# --------------------------------------------------------------------------- simulated evaluation

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
                           ranges: Sequence[float] | None = None) -> dict[str, dict[str, EvalResult]]:
    """AP per sensor (and "all" pooled) for each named detector ``fn(points) -> (boxes, labels, scores)``;
    with ``ranges`` (bin edges in metres) also the pooled AP per range bin, keyed "all <lo>-<hi> m"."""
    per: dict[str, dict[str, EvalResult]] = {name: {} for name in detect_fns}
    pooled: dict[str, tuple[list, list]] = {name: ([], []) for name in detect_fns}
    for sensor in sensors:
        frames = simulated_eval_frames(sensor, n, seed, sim_options)
        for name, fn in detect_fns.items():
            dets = []
            for pts, _ in frames:
                b, lab, sc = fn(pts)
                dets.append(FrameBoxes(b, lab, sc))
            gts = [g for _, g in frames]
            per[name][sensor] = evaluate(dets, gts, classes, min_points, region, metrics)
            pooled[name][0].extend(dets)
            pooled[name][1].extend(gts)
    for name in detect_fns:
        per[name]["all"] = evaluate(pooled[name][0], pooled[name][1], classes, min_points, region, metrics)
        for label, rb in range_bins(ranges):
            per[name][f"all {label}"] = evaluate(pooled[name][0], pooled[name][1], classes, min_points, region,
                                                 metrics, rb)
    return per


def range_bins(edges: Sequence[float] | None) -> list[tuple[str, tuple[float, float]]]:
    """Bin edges [0, 20, 40, inf] -> [("0-20 m", (0, 20)), ("20-40 m", (20, 40)), ("40+ m", (40, inf))]."""
    if not edges:
        return []
    e = [float(v) for v in edges]
    if len(e) < 2 or any(not b > a for a, b in zip(e, e[1:])) or e[0] < 0 or any(math.isnan(v) for v in e):
        raise ConfigError(f"--ranges needs at least two increasing distances >= 0 (metres), got {list(edges)}")
    return [(f"{a:g}+ m" if math.isinf(b) else f"{a:g}-{b:g} m", (a, b)) for a, b in zip(e, e[1:])]


def summary_table(results: dict[str, EvalResult], title: str) -> str:
    """One row per sensor: car BEV/3D AP@0.7, pedestrian and cyclist BEV/3D AP@0.5."""
    cols = [("car", "bev@0.7"), ("car", "3d@0.7"), ("car", "bev@0.5"), ("pedestrian", "bev@0.5"),
            ("pedestrian", "3d@0.5"), ("cyclist", "bev@0.5"), ("cyclist", "3d@0.5")]
    head = f"{'sensor':<13}" + "".join(f"{c[:3] + ' ' + k:>13}" for c, k in cols) + f"{'GT c/p/y':>14}"
    lines = [title, head]
    for sensor, r in results.items():
        vals = "".join(f"{r.ap.get(c, {}).get(k, float('nan')):>13.3f}" for c, k in cols)
        gt = "/".join(str(r.num_gt.get(c, 0)) for c in ("car", "pedestrian", "cyclist"))
        lines.append(f"{sensor:<13}{vals}{gt:>14}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="?", help="rosbag2 with clouds and ground truth (omit with --sim-frames)")
    p.add_argument("--sim-frames", type=int, default=None,
                   help="instead of a bag: this many freshly simulated held-out frames per sensor")
    p.add_argument("--sensors", default="mid40,mid70,tele15,horizon,avia", help="sensors for --sim-frames")
    p.add_argument("--seed", type=int, default=0, help="seed of the --sim-frames scenes")
    p.add_argument("--detections", help="detections JSONL from `livox-infer detect`; default: run the detector now")
    p.add_argument("--labels", help="ground truth as a JSONL file instead of the bag's GT topic")
    p.add_argument("--gt-topic", default="/livox_infer/ground_truth")
    p.add_argument("--cloud-topic", default=None, help="cloud topic (counts GT points; detection input)")
    p.add_argument("--model", default="lite", help="model config name or YAML path (when detecting)")
    p.add_argument("--weights", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--sensor-height", default="auto", help="metres or 'auto' (when detecting)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--test-time-flip", action="store_true", help="average the frame and its mirror image")
    p.add_argument("--no-refine", action="store_true", help="stage 1 alone: skip the stage-2 refiner of models with a refine section")
    p.add_argument("--baseline", action="store_true", help="also evaluate the non-learned baseline")
    p.add_argument("--min-points", type=int, default=DEFAULT_MIN_POINTS, help="ignore GT with fewer lidar points")
    p.add_argument("--region", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"),
                   help="evaluate only inside this BEV rectangle (default: the model's grid)")
    p.add_argument("--score-threshold", default="0.1",
                   help="keep detections down to this score for the AP ranking (default 0.1, as OpenPCDet "
                        "evaluates); 'config': the model config's per-class operating thresholds")
    p.add_argument("--sim-option", action="append", default=[], metavar="KEY=VALUE",
                   help="simulate_frame option for --sim-frames, e.g. 'ego_speed=[0,15]' "
                        "'yaw_rate_dps=[-15,15]' (a moving, turning vehicle); repeatable")
    p.add_argument("--ranges", default=None, metavar="EDGES",
                   help="also report AP per range bin of the object's BEV distance from the sensor, e.g. "
                        "'0,20,40,inf' (pooled over sensors; GT and detections outside a bin are left out)")
    p.add_argument("--bev-extent", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"), default=None,
                   help="run the network on this BEV extent in metres (multiples of 3.2 for lite) instead of the "
                        "model's, e.g. 0 80 -51.2 51.2 for an 80 m, ±40° cone; the same weights")
    p.add_argument("--out", help="write the results as JSON here")
    add_threads_argument(p)
    from livox_infer.evaluation.archive import add_arguments as add_archive_arguments
    from livox_infer.presets import SENSOR_PRESETS

    p.add_argument("--sensor", default=None, choices=SENSOR_PRESETS,
                   help="apply config/<sensor>.yaml as the node does (ROI, range, tag filter, sensor height, grid; "
                        "the AP ranking keeps --score-threshold); with --sim-frames, simulate this sensor only")
    p.add_argument("--sim-accumulate", type=int, default=None, metavar="K",
                   help="with --sim-frames: score each frame alone and its drive's last K frames stacked, with and "
                        "without poses (livox_infer/evaluation/accumulated.py)")
    from livox_infer.evaluation.real import add_arguments as add_real_arguments

    add_real_arguments(p)
    add_archive_arguments(p)


def parse_sim_options(items: Sequence[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` (VALUE in YAML: numbers, [lo, hi] ranges, true/false) -> dict."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--sim-option must be KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--sim-option {item!r}: value is not valid YAML ({exc})") from exc
    return out


def parse_ranges(value: str | None) -> list[float] | None:
    """'0,20,40,inf' -> [0.0, 20.0, 40.0, inf] (checked by `range_bins`); None stays None."""
    if value is None:
        return None
    try:
        edges = [float(v) for v in str(value).split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--ranges must be comma-separated distances in metres, got {value!r}") from exc
    range_bins(edges)
    return edges


def _score_thresholds(value: str):
    """None (the config's) for 'config', else one float for every class."""
    if str(value).strip().lower() == "config":
        return None
    try:
        v = float(value)
    except ValueError as exc:
        raise ConfigError(f"--score-threshold must be a number in [0, 1] or 'config', got {value!r}") from exc
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"--score-threshold must be a number in [0, 1] or 'config', got {value!r}")
    return v


def _gt_from_bag(path: str, topic: str, cloud_topic: str | None):
    from livox_infer.bag import read_clouds, read_detections

    gts = [FrameBoxes(f.boxes, f.labels, None, None, f.stamp_ns) for f in read_detections(path, topic)]
    clouds = {c.stamp_ns: c for _, c in read_clouds(path, cloud_topic)}
    for g in gts:
        cloud = clouds.get(g.stamp_ns)
        if cloud is not None:
            g.num_points = points_in_boxes(cloud.points, g.boxes)
    return gts, clouds


def main(args: argparse.Namespace) -> int:
    from livox_infer.model.config import ModelConfig

    try:
        parse_ranges(args.ranges)  # a bad --ranges fails before any detection runs
        if args.detections_dir:
            from livox_infer.evaluation.archive import main_archive

            return main_archive(args)
        if args.real:
            from livox_infer.evaluation.real import main_real

            return main_real(args, lambda: _pipeline(args))
        if args.sim_frames and args.sim_accumulate:
            from livox_infer.evaluation.accumulated import main_accumulated

            return main_accumulated(args, _pipeline(args))
        if args.sim_frames:
            return _main_sim(args)
        if not args.input:
            raise ConfigError("give a bag (INPUT) or --sim-frames N")
        clouds: dict[int, Any] = {}
        if args.labels:
            gts = read_jsonl(args.labels)
        else:
            gts, clouds = _gt_from_bag(args.input, args.gt_topic, args.cloud_topic)
        if not gts:
            raise ConfigError("no ground-truth frames found")
        cfg = ModelConfig.load(args.model)
        region = eval_region(args, cfg)
        results: dict[str, Any] = {"min_points": args.min_points, "region": list(region),
                                   "score_threshold": args.score_threshold, "test_time_flip": args.test_time_flip,
                                   "refine": not args.no_refine}
        runs: list[tuple[str, list[FrameBoxes]]] = []
        if args.detections:
            runs.append(("detections", read_jsonl(args.detections)))
        else:
            if not clouds:
                from livox_infer.bag import read_clouds

                clouds = {c.stamp_ns: c for _, c in read_clouds(args.input, args.cloud_topic)}
            pipe = _pipeline(args)
            dets = []
            for stamp, cloud in clouds.items():
                d = pipe.detect(cloud)
                dets.append(FrameBoxes(d.boxes, d.labels, d.scores, None, stamp))
            runs.append((f"model {cfg.name}", dets))
        if args.baseline:
            from livox_infer.model.baseline import BaselineDetector

            if not clouds:
                from livox_infer.bag import read_clouds

                clouds = {c.stamp_ns: c for _, c in read_clouds(args.input, args.cloud_topic)}
            sh = "auto" if args.sensor_height == "auto" else float(args.sensor_height)
            base = BaselineDetector(sensor_height=sh)
            dets = []
            for stamp, cloud in clouds.items():
                b = base.detect(cloud.points)
                dets.append(FrameBoxes(b.boxes, b.labels, b.scores, None, stamp))
            runs.append(("baseline", dets))
        bins = range_bins(parse_ranges(args.ranges))
        for name, dets in runs:
            d_al, g_al = align_frames(dets, gts)
            res = evaluate(d_al, g_al, cfg.classes, args.min_points, region)
            print(res.table(f"== {name}: {res.num_frames} frames, AP (R40), GT with < {args.min_points} points ignored =="))
            results[name] = res.to_dict()
            for label, rb in bins:
                r = evaluate(d_al, g_al, cfg.classes, args.min_points, region, range_bin=rb)
                print(r.table(f"-- {name}, objects at {label} from the sensor --"))
                results[name].setdefault("by_range", {})[label] = r.to_dict()
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2, allow_nan=True))
        return 0
    except LivoxInferError as exc:
        print(f"livox-infer eval: {exc}", file=sys.stderr)
        return 2


def scan_detector(pipe):
    """``fn(points) -> (boxes, labels, scores)`` of ``pipe`` for unrelated scans: the ground estimate of one
    scan is not smoothed with the previous ones ("auto" sensor height)."""
    def detect(points):
        pipe.reset_ground()
        d = pipe.detect(points)
        return d.boxes, d.labels, d.scores

    return detect


def eval_region(args: argparse.Namespace, cfg) -> tuple[float, float, float, float]:
    """--region, else the grid the detector runs on (the --sensor preset's, --bev-extent, or the model's own)."""
    if args.region:
        return tuple(args.region)
    extent = getattr(args, "bev_extent", None)
    if getattr(args, "sensor", None):
        from livox_infer.presets import load_preset, pipeline_options

        extent = pipeline_options(load_preset(args.sensor))["bev_extent"] or extent
    return cfg.with_extent(extent).grid.region if extent else cfg.grid.region


def _pipeline(args: argparse.Namespace):
    """The detection pipeline the eval options describe."""
    from livox_infer.pipeline import DetectionPipeline

    sh = args.sensor_height if args.sensor_height == "auto" else float(args.sensor_height)
    opts = dict(model=args.model, weights=args.weights, device=args.device, compile=not args.no_compile,
                sensor_height=sh, score_thresholds=_score_thresholds(args.score_threshold),
                test_time_flip=args.test_time_flip, refine=not args.no_refine,
                bev_extent=getattr(args, "bev_extent", None))
    if getattr(args, "sensor", None):  # the node's preset, except the AP ranking threshold and this machine's choices
        from livox_infer.presets import load_preset, pipeline_options

        keep = ("device", "compile", "weights", "aoti_package", "score_thresholds")
        opts.update({k: v for k, v in pipeline_options(load_preset(args.sensor)).items() if k not in keep})
    return DetectionPipeline(**opts)


def _main_sim(args: argparse.Namespace) -> int:
    pipe = _pipeline(args)
    cfg = pipe.cfg
    region = eval_region(args, cfg)
    sh = args.sensor_height if args.sensor_height == "auto" else float(args.sensor_height)
    sim_options = parse_sim_options(args.sim_option)
    fns = {f"model {cfg.name}": scan_detector(pipe)}
    if args.baseline:
        from livox_infer.model.baseline import BaselineDetector

        base = BaselineDetector(sensor_height=sh)

        def base_fn(points):
            b = base.detect(points)
            return b.boxes, b.labels, b.scores

        fns["baseline"] = base_fn
    sensors = [args.sensor] if args.sensor else [s.strip() for s in args.sensors.split(",") if s.strip()]
    res = evaluate_on_simulation(fns, sensors, args.sim_frames, args.seed, cfg.classes, args.min_points, region,
                                 sim_options=sim_options, ranges=parse_ranges(args.ranges))
    out: dict[str, Any] = {"min_points": args.min_points, "region": list(region), "frames_per_sensor": args.sim_frames,
                           "seed": args.seed, "sensor_height": args.sensor_height, "sim_options": sim_options,
                           "score_threshold": args.score_threshold,
                           "test_time_flip": args.test_time_flip, "refine": not args.no_refine}
    for name, per in res.items():
        print(summary_table(per, f"== {name}: {args.sim_frames} held-out simulated frames per sensor, "
                                 f"AP R40, GT with < {args.min_points} points ignored =="))
        out[name] = {sensor: r.to_dict() for sensor, r in per.items()}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    return 0
