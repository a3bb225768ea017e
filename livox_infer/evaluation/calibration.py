"""Do scores mean something? Reliability of detections (score bin -> share that is right) and the fit of the
model config's ``score_calibration`` (detector/calibration.py) on cross-validated real detections.

A detection is *right* when it matches a labelled object of its class at the class's loose BEV IoU (car 0.5,
pedestrian and cyclist 0.25; `metrics.IOU_THRESHOLDS`), matched greedily by score as AP matches; one on an
ignored object (a van for a car, too few points, outside the view) is neither and left out.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from livox_infer.evaluation.metrics import IOU_THRESHOLDS, FrameBoxes, assign_frame, scored_in_region

BIN_EDGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001)
KNOTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # raw scores the fitted table is given at
MIN_DETECTIONS = 30  # a class with fewer scored detections keeps its raw score (too few to fit)
# the held-out check of a fit (cross_fitted_ece) fits on one source's detections, fewer than the pooled fit has:
# with the ridge towards the identity a 15-detection fit is still a fit worth judging
HELD_OUT_MIN_FIT = 15


def outcomes(dets: Sequence[FrameBoxes], gts: Sequence[FrameBoxes], gt_ignore: Sequence[np.ndarray],
             classes: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per class: (scores, right) of every detection that is not neutral (see the module doc)."""
    out: dict[str, tuple[list, list]] = {c: ([], []) for c in classes}
    for d, g, ign in zip(dets, gts, gt_ignore):
        for k, c in enumerate(classes):
            dm, gm = d.labels == k, g.labels == k
            if not dm.any():
                continue
            thr = IOU_THRESHOLDS.get(c, (0.5, 0.25))[1]
            match, neutral, _ = assign_frame(d.boxes[dm], d.scores[dm], g.boxes[gm], np.asarray(ign)[gm], thr)
            out[c][0].extend(d.scores[dm][~neutral].tolist())
            out[c][1].extend((match >= 0)[~neutral].tolist())
    return {c: (np.asarray(s, np.float64), np.asarray(r, bool)) for c, (s, r) in out.items()}


def reliability(scores: np.ndarray, right: np.ndarray, edges: Sequence[float] = BIN_EDGES):
    """Rows (low, high, detections, share right) for the score bins [edges[i], edges[i+1])."""
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (scores >= lo) & (scores < hi)
        n = int(m.sum())
        rows.append((lo, min(hi, 1.0), n, float(right[m].mean()) if n else math.nan))
    return rows


def reliability_table(res: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> str:
    """Score bin -> detections and share right, per class and pooled; with the expected calibration error
    (mean |share right - mean score| weighted by detections)."""
    names = [c for c in res if len(res[c][0])]
    head = f"{'score':<11}" + "".join(f"{c[:10]:>16}" for c in names) + f"{'all':>16}"
    lines = [title, head + "   (detections: share right)", "-" * len(head)]
    pooled = (np.concatenate([res[c][0] for c in names]) if names else np.zeros(0),
              np.concatenate([res[c][1] for c in names]) if names else np.zeros(0, bool))
    cols = [reliability(*res[c]) for c in names] + [reliability(*pooled)]
    for i, (lo, hi, _, _) in enumerate(cols[0] if cols else []):
        cells = "".join(f"{f'{n}: {r:.2f}' if n else '-':>16}" for _, _, n, r in (col[i] for col in cols))
        lines.append(f"{lo:.1f}-{hi:.1f}".ljust(11) + cells)
    eces = [expected_calibration_error(*res[c]) for c in names] + [expected_calibration_error(*pooled)]
    lines.append("ECE".ljust(11) + "".join(f"{e:>16.3f}" for e in eces))
    return "\n".join(lines)


def expected_calibration_error(scores: np.ndarray, right: np.ndarray, edges: Sequence[float] = BIN_EDGES) -> float:
    total, err = 0, 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (scores >= lo) & (scores < hi)
        n = int(m.sum())
        if n:
            err += n * abs(float(right[m].mean()) - float(scores[m].mean()))
            total += n
    return err / total if total else math.nan


def platt(scores: np.ndarray, right: np.ndarray, ridge: float = 1.0, iters: int = 50) -> tuple[float, float]:
    """(a, b) of P(right) = sigmoid(a * logit(score) + b), maximum likelihood with a ridge pulling towards the
    identity (a = 1, b = 0): two parameters, so a class with a few hundred detections gives a stable map."""
    x = np.log(np.clip(scores, 1e-4, 1 - 1e-4) / (1 - np.clip(scores, 1e-4, 1 - 1e-4)))
    y = right.astype(np.float64)
    theta = np.array([1.0, 0.0])
    prior = np.array([1.0, 0.0])
    feats = np.c_[x, np.ones_like(x)]
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(feats @ theta)))
        grad = feats.T @ (p - y) + ridge * (theta - prior)
        hess = feats.T @ (feats * (p * (1 - p))[:, None]) + ridge * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), float(theta[1])


def fit_knots(scores: np.ndarray, right: np.ndarray, knots: Sequence[float] = KNOTS,
              min_detections: int = MIN_DETECTIONS) -> list[list[float]] | None:
    """Calibration knots [[raw, calibrated], ...] of one class from a Platt fit (`platt`), read at ``knots``;
    None below ``min_detections`` or when the fit is not increasing (the score carries no ranking to keep)."""
    if len(scores) < min_detections:
        return None
    a, b = platt(np.asarray(scores, np.float64), np.asarray(right, bool))
    if not a > 0:
        return None
    k = np.clip(np.asarray(knots, np.float64), 1e-4, 1 - 1e-4)
    vals = 1.0 / (1.0 + np.exp(-(a * np.log(k / (1 - k)) + b)))
    return [[float(x), round(float(v), 3)] for x, v in zip(knots, np.maximum.accumulate(vals))]


def cross_fitted_ece(by_source: dict[str, tuple[np.ndarray, np.ndarray]],
                     min_fit: int = HELD_OUT_MIN_FIT) -> dict[str, Any] | None:
    """One class's calibration judged on detections it was not fitted on: for each source, a Platt fit on the
    other sources' detections (at least ``min_fit`` of them) applied to this source's, with that source's ECE before
    and after. ``ece_before`` / ``ece_after``: their mean weighted by detections, what a user of one sensor sees.
    (The ECE of the sources' detections pooled is not used: fits that push two sources' scores opposite ways cancel
    in pooled bins and look better while each source gets worse.) None when no source could be scored. The
    in-sample ECE of a fit on a few dozen boxes flatters it; this one does not."""
    scored = {}
    for src, (s, r) in by_source.items():
        rest = [by_source[o] for o in by_source if o != src]
        fit_s = np.concatenate([x[0] for x in rest]) if rest else np.zeros(0)
        fit_r = np.concatenate([x[1] for x in rest]) if rest else np.zeros(0, bool)
        if not len(s) or len(fit_s) < min_fit:
            continue
        knots = fit_knots(fit_s, fit_r, min_detections=min_fit)
        if knots is None:
            continue
        xs, ys = np.asarray(knots).T
        scored[src] = {"detections": int(len(s)), "fitted_on": int(len(fit_s)),
                       "ece_before": expected_calibration_error(s, r),
                       "ece_after": expected_calibration_error(np.interp(s, xs, ys), r)}
    if not scored:
        return None
    n = np.array([d["detections"] for d in scored.values()], np.float64)
    mean = lambda key: float(np.dot(n, [d[key] for d in scored.values()]) / n.sum())  # noqa: E731
    return {"sources": scored, "ece_before": mean("ece_before"), "ece_after": mean("ece_after")}


def compose(knots_new: list[list[float]], knots_old) -> list[list[float]]:
    """Knots of (new after old): fitting on already calibrated scores, the table to store maps raw scores."""
    if not knots_old:
        return knots_new
    ox, oy = [a for a, _ in knots_old], [b for _, b in knots_old]
    nx, ny = [a for a, _ in knots_new], [b for _, b in knots_new]
    return [[float(x), round(float(np.interp(np.interp(x, ox, oy), nx, ny)), 3)] for x in ox]


def operating_points(res: dict[str, tuple[np.ndarray, np.ndarray]], thresholds: dict[str, float],
                     num_gt: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per class at its operating threshold: detections kept, precision and recall (loose IoU)."""
    out = {}
    for c, (s, r) in res.items():
        t = thresholds.get(c)
        if t is None:
            continue
        keep = s >= t
        n = int(keep.sum())
        tp = int(r[keep].sum())
        out[c] = {"threshold": float(t), "detections": n, "precision": tp / n if n else math.nan,
                  "recall": tp / num_gt[c] if num_gt.get(c) else math.nan}
    return out


def best_f1_threshold(scores: np.ndarray, right: np.ndarray, num_gt: int, step: float = 0.05) -> dict[str, float]:
    """The threshold (a multiple of ``step``) whose kept detections have the best F1 against ``num_gt`` objects,
    with that precision and recall: the operating point the model config's thresholds are set to."""
    best = {"threshold": math.nan, "f1": -1.0, "precision": math.nan, "recall": math.nan}
    if not num_gt:
        return best
    for t in np.arange(step, 1.0, step):
        keep = scores >= t
        tp = int(right[keep].sum())
        if not keep.any():
            break
        prec, rec = tp / int(keep.sum()), tp / num_gt
        f1 = 2 * prec * rec / (prec + rec) if tp else 0.0
        if f1 > best["f1"] + 1e-9:
            best = {"threshold": round(float(t), 2), "f1": f1, "precision": prec, "recall": rec}
    return best


def simulated_reliability(dets, gts, cfg, min_points: int, region, num_gt: dict[str, int]) -> dict[str, Any]:
    """`livox-infer eval --sim-frames N --reliability`: the reliability table, each class's precision / recall at
    the model's operating threshold and its best-F1 threshold, on held-out simulated frames (GT with fewer than
    ``min_points`` points or outside ``region`` neutral). Where few real labels exist (trucks, buses) these are
    the numbers an operating threshold can be chosen on."""
    kept, ignore = scored_in_region(dets, gts, min_points, region)
    res = outcomes(kept, gts, ignore, cfg.classes)
    print(reliability_table(res, "== reliability on the simulated frames: score bin -> detections: share right =="))
    ops = operating_points(res, dict(zip(cfg.classes, cfg.score_thresholds)), num_gt)
    best = {c: best_f1_threshold(*res[c], num_gt.get(c, 0)) for c in cfg.classes}
    for c, o in ops.items():
        b = best[c]
        print(f"{c:<11} threshold {o['threshold']:.2f}: precision {o['precision']:.2f}, recall {o['recall']:.2f}; "
              f"best F1 at {b['threshold']:.2f} (precision {b['precision']:.2f}, recall {b['recall']:.2f})")
    return {"bins": {c: reliability(*r) for c, r in res.items()}, "operating": ops, "best_f1": best}
