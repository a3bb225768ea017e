"""Average precision (KITTI R40) per class with rotated BEV and 3D IoU; `livox-infer eval`.

Matching, per frame and class: detections in descending score order each take the unmatched
ground-truth box of highest IoU >= threshold (true positive) or count as false positives.
Ground truth with fewer than `min_points` lidar points inside (default 5; too few points to be
detectable) and ground truth outside the evaluated region is *ignored*: it is not counted as a
miss, and a detection matched to it is neither TP nor FP. Detections outside the region are dropped.
AP = mean over recall r in {1/40, 2/40, ..., 1} of the best precision at recall >= r.

Thresholds (IoU): car 0.7 / 0.5, pedestrian and cyclist 0.5 / 0.25 (strict / loose); truck and bus 0.7 / 0.5, as cars; each for BEV and 3D.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError
from livox_infer.detector.boxes import bev_iou, iou_3d


R40 = np.linspace(1.0 / 40, 1.0, 40)

DEFAULT_MIN_POINTS = 5


IOU_THRESHOLDS = {"car": (0.7, 0.5), "pedestrian": (0.5, 0.25), "cyclist": (0.5, 0.25), "truck": (0.7, 0.5),
                  "bus": (0.7, 0.5)}


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


def assign_frame(det_boxes, det_scores, gt_boxes, gt_ignore, threshold: float, metric: str = "bev"):
    """Greedy assignment in one frame and class, highest score first: each detection takes the unmatched
    relevant GT box of highest IoU >= threshold, else is neutralised by an ignored GT box it overlaps.
    Returns (gt index per detection or -1 (D,), neutralised (D,) bool, IoU matrix (D, G))."""
    d, g = det_boxes.shape[0], gt_boxes.shape[0]
    match = np.full(d, -1, np.int64)
    neutral = np.zeros(d, bool)
    if d == 0 or g == 0:
        return match, neutral, np.zeros((d, g))
    fn = bev_iou if metric == "bev" else iou_3d
    iou = fn(torch.from_numpy(np.asarray(det_boxes, np.float64)), torch.from_numpy(np.asarray(gt_boxes, np.float64))).numpy()
    used = np.zeros(g, bool)
    for i in np.argsort(-np.asarray(det_scores), kind="stable"):
        # prefer relevant GT, then ignored GT (which neutralises the detection)
        cand = np.where(~used & ~gt_ignore & (iou[i] >= threshold), iou[i], -1.0)
        j = int(cand.argmax())
        if cand[j] >= 0:
            used[j] = True
            match[i] = j
            continue
        cand = np.where(gt_ignore & (iou[i] >= threshold), iou[i], -1.0)
        if cand.size and cand.max() >= 0:
            neutral[i] = True
    return match, neutral, iou


def match_frame(det_boxes, det_scores, gt_boxes, gt_ignore, threshold: float, metric: str = "bev"):
    """Greedy matching in one frame and class (`assign_frame`). Returns (tp (D,) bool, keep (D,) bool,
    num_relevant_gt); keep is False for detections matched to an ignored GT box (they are removed from the
    PR curve)."""
    match, neutral, _ = assign_frame(det_boxes, det_scores, gt_boxes, gt_ignore, threshold, metric)
    return match >= 0, ~neutral, int((~gt_ignore).sum())


@dataclass
class EvalResult:
    ap: dict[str, dict[str, float]] = field(default_factory=dict)  # class -> {"bev@0.7": ap, ...}
    num_gt: dict[str, int] = field(default_factory=dict)  # relevant (non-ignored) GT per class
    num_ignored: dict[str, int] = field(default_factory=dict)
    num_frames: int = 0
    # class -> {"bev@0.5": share of the relevant GT some detection (any score) matched, ...}: where GT is too scarce
    # for an AP (real trucks and buses)
    recall: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ap": self.ap, "num_gt": self.num_gt, "num_ignored": self.num_ignored, "num_frames": self.num_frames,
                "recall": self.recall}

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


def scored_in_region(dets: Sequence[FrameBoxes], gts: Sequence[FrameBoxes], min_points: int,
                     region) -> tuple[list[FrameBoxes], list[np.ndarray]]:
    """The detections and ground-truth ignore masks the AP scores on simulated frames: detections outside
    ``region`` dropped; GT with fewer than ``min_points`` points or outside it ignored."""
    kept = [FrameBoxes(d.boxes[m], d.labels[m], d.scores[m]) for d in dets for m in [in_region(d.boxes, region)]]
    ignore = [(g.num_points < min_points) | ~in_region(g.boxes, region) for g in gts]
    return kept, ignore


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
        res.recall[cls] = {}
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
                res.recall[cls][f"{metric}@{thr:g}"] = float(tps.sum()) / n_gt if n_gt else math.nan
                res.num_gt[cls] = n_gt
                res.num_ignored[cls] = n_ign
    return res


def evaluate_by_sensor(detections: Mapping[str, Sequence[FrameBoxes]], ground_truth: Mapping[str, Sequence[FrameBoxes]],
                       classes: Sequence[str] = CLASS_NAMES, min_points: int = DEFAULT_MIN_POINTS, region=None,
                       metrics: Iterable[str] = ("bev", "3d"), ranges: Sequence[float] | None = None,
                       ) -> dict[str, EvalResult]:
    """AP per sensor, pooled over the sensors ("all") and, with ``ranges`` (bin edges in metres), pooled per range
    bin ("all <lo>-<hi> m"). ``detections`` / ``ground_truth``: frames per sensor, in the same order."""
    per = {s: evaluate(detections[s], ground_truth[s], classes, min_points, region, metrics) for s in ground_truth}
    pooled_d = [d for s in ground_truth for d in detections[s]]
    pooled_g = [g for s in ground_truth for g in ground_truth[s]]
    per["all"] = evaluate(pooled_d, pooled_g, classes, min_points, region, metrics)
    for label, rb in range_bins(ranges):
        per[f"all {label}"] = evaluate(pooled_d, pooled_g, classes, min_points, region, metrics, rb)
    return per


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


def range_bins(edges: Sequence[float] | None) -> list[tuple[str, tuple[float, float]]]:
    """Bin edges [0, 20, 40, inf] -> [("0-20 m", (0, 20)), ("20-40 m", (20, 40)), ("40+ m", (40, inf))]."""
    if not edges:
        return []
    e = [float(v) for v in edges]
    if len(e) < 2 or any(not b > a for a, b in zip(e, e[1:])) or e[0] < 0 or any(math.isnan(v) for v in e):
        raise ConfigError(f"--ranges needs at least two increasing distances >= 0 (metres), got {list(edges)}")
    return [(f"{a:g}+ m" if math.isinf(b) else f"{a:g}-{b:g} m", (a, b)) for a, b in zip(e, e[1:])]


def summary_table(results: dict[str, EvalResult], title: str) -> str:
    """One row per sensor: car BEV/3D AP@0.7, pedestrian and cyclist BEV/3D AP@0.5, and truck and bus BEV AP@0.5
    where the results have those classes."""
    cols = [("car", "bev@0.7"), ("car", "3d@0.7"), ("car", "bev@0.5"), ("pedestrian", "bev@0.5"),
            ("pedestrian", "3d@0.5"), ("cyclist", "bev@0.5"), ("cyclist", "3d@0.5")]
    classes = ["car", "pedestrian", "cyclist"]
    for extra in ("truck", "bus"):
        if any(extra in r.ap for r in results.values()):
            cols.append((extra, "bev@0.5"))
            classes.append(extra)
    head = (f"{'sensor':<13}" + "".join(f"{c[:3] + ' ' + k:>13}" for c, k in cols)
            + f"{'GT ' + '/'.join(c[0] if c != 'cyclist' else 'y' for c in classes):>16}")
    lines = [title, head]
    for sensor, r in results.items():
        vals = "".join(f"{r.ap.get(c, {}).get(k, float('nan')):>13.3f}" for c, k in cols)
        gt = "/".join(str(r.num_gt.get(c, 0)) for c in classes)
        lines.append(f"{sensor:<13}{vals}{gt:>16}")
    return "\n".join(lines)
