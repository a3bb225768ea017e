"""Average precision on real labelled scans seen the way a Livox sees them; `livox-infer eval --real DIR`.

A real-scan directory holds point files (`<frame>.npy` float32 (N, 4), `.bin` KITTI float32 x4 or `.pcd`)
and `labels.json` = ``{frame: [{"label", "x", "y", "z", "l", "w", "h", "yaw", ...}]}`` with geometric box
centres in the LiDAR frame (x forward, z up), l along the heading, yaw about +z. An optional `meta.json`
says per frame which region is labelled (``labelled_region``: "360 deg ..." or "... about 90 deg ...";
KITTI labels only the front camera's view).

Each frame is scored in one or more *views*: the scan turned so that a heading points forward, cropped
to a Livox-like cone (``fov`` degrees wide, ``max_range`` metres). A heading is used only where the cone
lies inside the labelled region, so a 360-degree scan gives several views and a KITTI scan one.
In a view:
- ground truth of our classes counts where its centre lies in the cone and it has >= ``min_points``
  points of the cropped scan inside; otherwise it is ignored (neither a miss nor a hit);
- classes that are not ours but look like one of ours (van, trailer, tram → car, and truck, bus → car for a
  model without those classes; person_sitting → pedestrian; bicycle without rider, motorcycle → cyclist; see
  ``IGNORE_AS``) are ignored boxes of that class: a detection on them is neither TP nor FP; a detection of
  another class there is an FP;
- detections whose centre lies outside the cone are dropped.
AP is the same R40 BEV and 3D AP as for simulated data, per source (frame-name prefix: ``kitti``,
``av2``...) and pooled over all views; trucks and buses, few in real labels, also as recall (`real_table`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError
from livox_infer.detector.boxes import points_in_boxes
from livox_infer.decode.pointfiles import read_points_file
from livox_infer.evaluation.beams import thin_beams as beam_thinned
from livox_infer.evaluation.metrics import (
    DEFAULT_MIN_POINTS, EvalResult, FrameBoxes, evaluate, in_region, range_bins,
)
from livox_infer.evaluation.options import eval_region, parse_ranges
from livox_infer.evaluation.simulated import scan_detector

# Source classes that are ignored for one of ours (KITTI's convention: a van is not a missed car, and
# a car box on it is not a false one). Everything else not ours (bollards, signs, ...) is background.
IGNORE_AS: dict[str, str] = {
    "van": "car", "truck": "car", "bus": "car", "trailer": "car", "tram": "car", "misc": "car",
    "person_sitting": "pedestrian", "stroller": "pedestrian", "wheelchair": "pedestrian",
    "bicycle": "cyclist", "rider": "cyclist", "motorcycle": "cyclist", "moped_scooter": "cyclist",
    "motorcyclist": "cyclist", "wheeled_rider": "cyclist",
}
POINT_SUFFIXES = (".npy", ".bin", ".pcd")
DEFAULT_FOV = 80.0  # degrees: Horizon / Avia-like (±40°)
DEFAULT_RANGE = 80.0
DEFAULT_HEADINGS = (0.0, 90.0, 180.0, 270.0)
BOOTSTRAP_LEVEL = 0.9  # the interval `--bootstrap` prints


@dataclass
class RealView:
    """One cropped, turned view of a real frame: points (N, 4) and ground truth in the view's frame."""

    frame: str
    source: str
    heading_deg: float
    points: np.ndarray
    gt: FrameBoxes  # labels index our classes; num_points in the cropped scan
    gt_ignore: np.ndarray  # (M,) bool: ignored GT (outside the cone, too few points, or an ignore class)
    rings_from: int = 0  # with --thin-beams K: the first of the scan's laser rings kept (every K-th from it)


def source_of(frame: str) -> str:
    """Source name of a frame from its name's prefix: 'kitti_000010' -> 'kitti'."""
    return frame.split("_", 1)[0]


def labelled_fov(meta: dict[str, Any] | None) -> float:
    """Width in degrees of the labelled region (centred ahead) from a meta.json entry; 360 when unknown."""
    text = str((meta or {}).get("labelled_region", ""))
    if not text or text.lstrip().startswith("360"):
        return 360.0
    m = re.search(r"(\d+(?:\.\d+)?)\s*deg", text)
    return float(m.group(1)) if m else 360.0


def turn(points_or_boxes: np.ndarray, heading_deg: float, boxes: bool = False) -> np.ndarray:
    """Rotate about +z by -heading so that direction ``heading_deg`` becomes +x (boxes: yaw too)."""
    a = -math.radians(heading_deg)
    c, s = math.cos(a), math.sin(a)
    out = np.array(points_or_boxes, np.float32, copy=True)
    x, y = out[:, 0].copy(), out[:, 1].copy()
    out[:, 0] = c * x - s * y
    out[:, 1] = s * x + c * y
    if boxes and len(out):
        out[:, 6] = (out[:, 6] + a + math.pi) % (2 * math.pi) - math.pi
    return out


def in_cone(xy: np.ndarray, fov_deg: float, max_range: float) -> np.ndarray:
    """Points / centres within ±fov/2 of +x and within max_range (BEV)."""
    xy = np.asarray(xy)[:, :2]
    r = np.hypot(xy[:, 0], xy[:, 1])
    az = np.degrees(np.abs(np.arctan2(xy[:, 1], xy[:, 0])))
    return (r <= max_range) & (az <= fov_deg / 2.0)


def load_real_dir(root: str | Path, fov: float = DEFAULT_FOV, max_range: float = DEFAULT_RANGE,
                  headings: Sequence[float] = DEFAULT_HEADINGS, min_points: int = DEFAULT_MIN_POINTS,
                  classes: Sequence[str] = CLASS_NAMES, labels: str | Path | None = None,
                  frames: Sequence[str] | None = None, thin_beams: int = 1,
                  left_out: list[str] | None = None) -> list[RealView]:
    """All views of the labelled scans in ``root`` (see the module doc). ``thin_beams`` K > 1: each view K times,
    each with every K-th laser ring of the scan from another first ring (`beams.thin_beams`); frames whose rings
    cannot be read are left out and their names appended to ``left_out``."""
    root = Path(root)
    labels_path = Path(labels) if labels else root / "labels.json"
    try:
        all_labels = json.loads(labels_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot load labels {labels_path}: {exc.__class__.__name__}") from None
    if not isinstance(all_labels, dict):
        raise ConfigError(f"{labels_path}: expected an object {{frame: [boxes]}}")
    meta: dict[str, Any] = {}
    if (root / "meta.json").is_file():
        try:
            meta = json.loads((root / "meta.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot load {root / 'meta.json'}: {exc.__class__.__name__}") from None
    if not 0 < fov <= 360 or not max_range > 0:
        raise ConfigError(f"fov must be in (0, 360] degrees and range > 0, got {fov}, {max_range}")
    views: list[RealView] = []
    names = sorted(all_labels) if frames is None else list(frames)
    for frame in names:
        path = next((root / f"{frame}{s}" for s in POINT_SUFFIXES if (root / f"{frame}{s}").is_file()), None)
        if path is None:
            raise ConfigError(f"{root}: no point file for labelled frame {frame!r} ({'/'.join(POINT_SUFFIXES)})")
        scans = beam_thinned(read_points_file(path), thin_beams)
        if scans is None:
            if left_out is not None:
                left_out.append(frame)
            continue
        boxes, labs, ignore_cls = _gt_arrays(all_labels.get(frame, []), classes, frame)
        lab_fov = labelled_fov(meta.get(frame))
        for h, (first_ring, pts) in itertools.product(headings, enumerate(scans)):
            # the view's cone must lie inside the labelled region (centred on heading 0)
            off = abs((float(h) + 180.0) % 360.0 - 180.0)
            if lab_fov < 360.0 and off + fov / 2.0 > lab_fov / 2.0 + 1e-6:
                continue
            vp = turn(pts, h)
            vp = vp[in_cone(vp, fov, max_range) & np.isfinite(vp).all(axis=1)]
            vb = turn(boxes, h, boxes=True)
            npts = points_in_boxes(vp, vb) if len(vb) else np.zeros(0, np.int64)
            ign = ignore_cls | ~in_cone(vb, fov, max_range) | (npts < min_points)
            views.append(RealView(frame, source_of(frame), float(h), vp,
                                  FrameBoxes(vb, labs, None, npts), ign, first_ring))
    if not views:
        if thin_beams > 1:
            raise ConfigError(f"{root}: no frame with laser rings in its file order (--thin-beams {thin_beams})")
        raise ConfigError(f"{root}: no view of any frame lies inside its labelled region (fov {fov}°)")
    return views


def _gt_arrays(items: list, classes: Sequence[str], frame: str):
    boxes, labs, ign = [], [], []
    for b in items:
        try:
            name = str(b["label"]).lower()
            box = [float(b[k]) for k in ("x", "y", "z", "l", "w", "h", "yaw")]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"labels of {frame}: bad box {b!r} ({exc})") from None
        if name in classes:
            cls, ignored = name, False
        elif IGNORE_AS.get(name) in classes:
            cls, ignored = IGNORE_AS[name], True
        else:
            continue
        boxes.append(box)
        labs.append(list(classes).index(cls))
        ign.append(ignored)
    return (np.asarray(boxes, np.float32).reshape(-1, 7), np.asarray(labs, np.int64), np.asarray(ign, bool))


def _in_view(views: Sequence[RealView], detections: Sequence[FrameBoxes], fov: float, max_range: float) -> list[FrameBoxes]:
    if len(views) != len(detections):
        raise ConfigError(f"{len(views)} views but {len(detections)} detection frames")
    dets = []
    for d in detections:
        keep = in_cone(d.boxes, fov, max_range)
        dets.append(FrameBoxes(d.boxes[keep], d.labels[keep], d.scores[keep]))
    return dets


def source_groups(views: Sequence[RealView]) -> dict[str, list[int]]:
    """The indices of each source's views, sources in the order first seen."""
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v.source, []).append(i)
    return groups


def evaluate_views(views: Sequence[RealView], detections: Sequence[FrameBoxes], classes: Sequence[str] = CLASS_NAMES,
                   fov: float = DEFAULT_FOV, max_range: float = DEFAULT_RANGE,
                   range_bin: tuple[float, float] | None = None) -> dict[str, EvalResult]:
    """AP per source and pooled ("all") of detections aligned with ``views`` (one FrameBoxes per view);
    ``range_bin`` (lo, hi) metres: only objects at that BEV distance count (`metrics.evaluate`)."""
    dets = _in_view(views, detections, fov, max_range)
    groups = source_groups(views)
    groups["all"] = list(range(len(views)))
    out = {}
    for name, idx in groups.items():
        out[name] = evaluate([dets[i] for i in idx], [views[i].gt for i in idx], classes,
                             gt_ignore=[views[i].gt_ignore for i in idx], range_bin=range_bin)
    return out


def beyond_grid(views: Sequence[RealView], classes: Sequence[str], region: tuple[float, float, float, float]) -> str:
    """One line: how many scored objects per class lie outside the detection grid ``region`` (x0, x1, y0, y1), where
    no detection can reach them (they still count as misses: the view cone is the task, not the grid)."""
    x0, x1, y0, y1 = region
    parts = []
    for ci, cls in enumerate(classes):
        n = out = 0
        for v in views:
            b = v.gt.boxes[(v.gt.labels == ci) & ~v.gt_ignore]
            n += len(b)
            out += int((~in_region(b, region)).sum())
        if n:
            parts.append(f"{cls} {out} of {n}")
    return (f"beyond the detection grid (x {x0:g}..{x1:g} m, y {y0:g}..{y1:g} m), out of reach but scored: "
            + ", ".join(parts))


def scene_of(frame: str) -> str:
    """The scene a frame belongs to: sweeps of one log (``av2_<log>_<time>``) are one scene, other frames their own."""
    parts = frame.split("_")
    return "_".join(parts[:2]) if len(parts) >= 3 else frame


def bootstrap_intervals(views: Sequence[RealView], detections: Sequence[FrameBoxes], classes: Sequence[str] = CLASS_NAMES,
                        n: int = 200, level: float = BOOTSTRAP_LEVEL, seed: int = 0, fov: float = DEFAULT_FOV,
                        max_range: float = DEFAULT_RANGE) -> dict[str, dict[str, list[float]]]:
    """Percentile interval (``level``) of the pooled AP over ``n`` resamples of whole scenes with replacement.

    All views of a scene (its headings, its other sweeps) are drawn together: they are not independent
    samples. The interval says how much the AP depends on which scenes happened to be labelled, i.e. what
    difference between two detectors on this set is more than noise."""
    if n < 1 or not 0.0 < level < 1.0:
        raise ConfigError(f"bootstrap needs n >= 1 and 0 < level < 1, got n={n}, level={level}")
    dets = _in_view(views, detections, fov, max_range)
    draws: dict[str, dict[str, list[float]]] = {}
    for idx in scene_resamples(views, n, seed):
        r = evaluate([dets[i] for i in idx], [views[i].gt for i in idx], classes,
                     gt_ignore=[views[i].gt_ignore for i in idx], metrics=("bev",))
        for cls, aps in r.ap.items():
            for metric, ap in aps.items():
                draws.setdefault(cls, {}).setdefault(metric, []).append(ap)
    return percentile_intervals(draws, level)


def scene_resamples(views: Sequence[RealView], n: int, seed: int = 0):
    """``n`` lists of view indices: the set's scenes drawn with replacement, each with all its views."""
    scenes: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        scenes.setdefault(scene_of(v.frame), []).append(i)
    keys = list(scenes)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield [i for k in rng.integers(0, len(keys), len(keys)) for i in scenes[keys[k]]]


def paired_bootstrap(views: Sequence[RealView], detections: Sequence[FrameBoxes], baseline: Sequence[FrameBoxes],
                     classes: Sequence[str] = CLASS_NAMES, n: int = 200, level: float = BOOTSTRAP_LEVEL, seed: int = 0,
                     fov: float = DEFAULT_FOV, max_range: float = DEFAULT_RANGE) -> dict[str, dict[str, list[float]]]:
    """Interval (``level``) of AP(detections) - AP(baseline) over the same ``n`` scene resamples: whether one
    detector is better than another on this set beyond which scenes happen to be in it."""
    a, b = _in_view(views, detections, fov, max_range), _in_view(views, baseline, fov, max_range)
    draws: dict[str, dict[str, list[float]]] = {}
    for idx in scene_resamples(views, n, seed):
        gts, ign = [views[i].gt for i in idx], [views[i].gt_ignore for i in idx]
        ra = evaluate([a[i] for i in idx], gts, classes, gt_ignore=ign, metrics=("bev",))
        rb = evaluate([b[i] for i in idx], gts, classes, gt_ignore=ign, metrics=("bev",))
        for cls, aps in ra.ap.items():
            for metric, ap in aps.items():
                draws.setdefault(cls, {}).setdefault(metric, []).append(ap - rb.ap[cls][metric])
    return percentile_intervals(draws, level)


def percentile_intervals(draws: dict[str, dict[str, list[float]]], level: float) -> dict[str, dict[str, list[float]]]:
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]

    def interval(values: list[float]) -> list[float]:
        v = np.asarray(values, float)
        v = v[np.isfinite(v)]  # a draw without GT of the class has no AP
        return [float(x) for x in np.percentile(v, q)] if len(v) else [math.nan, math.nan]

    return {cls: {m: interval(v) for m, v in aps.items()} for cls, aps in draws.items()}


def detect_views(views: Sequence[RealView], detect_fn: Callable[[np.ndarray], tuple]) -> list[FrameBoxes]:
    """Run ``detect_fn(points) -> (boxes, labels, scores)`` on every view."""
    out = []
    for v in views:
        b, lab, sc = detect_fn(v.points)
        out.append(FrameBoxes(b, lab, sc))
    return out


REAL_COLUMNS = (("car", "bev@0.5"), ("car", "bev@0.7"), ("car", "3d@0.7"), ("pedestrian", "bev@0.25"),
                ("pedestrian", "bev@0.5"), ("pedestrian", "3d@0.5"), ("cyclist", "bev@0.25"), ("cyclist", "bev@0.5"))


LARGE_CLASSES = ("truck", "bus")  # few real labels: reported as recall beside AP


def real_table(results: dict[str, EvalResult], title: str) -> str:
    """One row per source (and pooled): the sim-to-real headline columns and the relevant GT counts; for trucks and
    buses (when the model has them) a second block: GT, recall of any detection at BEV IoU 0.5 and BEV AP@0.5."""
    head = f"{'source':<8}{'views':>6}" + "".join(f"{c[:3] + ' ' + k:>14}" for c, k in REAL_COLUMNS) + f"{'GT c/p/y':>11}"
    lines = [title, head, "-" * len(head)]
    for src, r in results.items():
        vals = "".join(f"{r.ap.get(c, {}).get(k, float('nan')):>14.3f}" for c, k in REAL_COLUMNS)
        gt = "/".join(str(r.num_gt.get(c, 0)) for c in ("car", "pedestrian", "cyclist"))
        lines.append(f"{src:<8}{r.num_frames:>6}{vals}{gt:>11}")
    large = [c for c in LARGE_CLASSES if any(c in r.ap for r in results.values())]
    if large:
        head = f"{'source':<8}" + "".join(f"{c + ' GT':>10}{c + ' recall@0.5':>18}{c + ' bev@0.5':>15}" for c in large)
        lines += [head, "-" * len(head)]
        for src, r in results.items():
            lines.append(f"{src:<8}" + "".join(
                f"{r.num_gt.get(c, 0):>10}{r.recall.get(c, {}).get('bev@0.5', float('nan')):>18.3f}"
                f"{r.ap.get(c, {}).get('bev@0.5', float('nan')):>15.3f}" for c in large))
    return "\n".join(lines)


def interval_table(intervals: dict[str, dict[str, list[float]]], n: int, level: float, what: str = "") -> str:
    """The pooled bootstrap interval of each headline BEV column (3D columns: '-'); ``what``: of a difference
    (signed, e.g. +0.01..+0.07)."""
    cells = []
    for c, k in REAL_COLUMNS:
        iv = intervals.get(c, {}).get(k)
        text = "-" if iv is None else (f"{iv[0]:+.2f}..{iv[1]:+.2f}" if what else f"{iv[0]:.2f}-{iv[1]:.2f}")
        cells.append(f"{text:>14}")
    return f"{'all':<8}{'':>6}" + "".join(cells) + f"   <- {level:.0%} interval{what}, {n} scene resamples"


# --------------------------------------------------------------------------- CLI (`livox-infer eval --real DIR`)


def add_arguments(p) -> None:
    """Options of the real-scan mode; the shared ones (--model, --weights, --device, ...) are eval's."""
    g = p.add_argument_group("real labelled scans (--real DIR)")
    g.add_argument("--real", metavar="DIR", default=None,
                   help="score a directory of labelled real scans (point files + labels.json [+ meta.json])")
    g.add_argument("--fov", type=float, default=DEFAULT_FOV, help="view cone width in degrees (default 80: ±40°)")
    g.add_argument("--range", dest="max_range", type=float, default=DEFAULT_RANGE, help="view range in metres")
    g.add_argument("--headings", default=",".join(f"{h:g}" for h in DEFAULT_HEADINGS),
                   help="headings (degrees) a scan is seen from, where the labelled region allows (default 0,90,180,270)")
    g.add_argument("--thin-beams", type=int, default=1, metavar="K",
                   help="keep only every K-th laser ring of each scan (2: 64 beams -> 32), read from the point "
                        "file's laser order (KITTI's); frames without it are left out and named (docs/evaluation.md)")
    g.add_argument("--bev-dir", default=None, help="also write a BEV picture per view (labels dashed, detections solid)")
    g.add_argument("--cross-validate", action="append", default=[], metavar="SOURCE=WEIGHTS",
                   help="score the frames of SOURCE (kitti, av2) with WEIGHTS, which must not have been trained on "
                        "SOURCE (checked in the weights' metadata); once per source: the pooled number is the "
                        "cross-validated real accuracy (docs/evaluation.md)")
    g.add_argument("--reliability", action="store_true",
                   help="also print the reliability table (score bin -> share of detections that are right) and "
                        "each class's precision / recall / AP at the model's operating thresholds")
    g.add_argument("--fit-calibration", metavar="OUT.yaml", default=None,
                   help="fit the score_calibration (Platt, per class) on these detections (use with "
                        "--cross-validate) and write it as a model-config snippet")
    g.add_argument("--paired-with", action="append", default=[], metavar="WEIGHTS|MODEL|SOURCE=WEIGHTS",
                   help="with --bootstrap: also score WEIGHTS (a file for this model) or MODEL (a model name, e.g. "
                        "lite-sim), which must not have seen these frames, and print the interval of the AP difference "
                        "over the same scene resamples; SOURCE=WEIGHTS once per source (as --cross-validate takes): "
                        "compare with other cross-validated fold weights")
    g.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help=f"also print the pooled AP's {BOOTSTRAP_LEVEL * 100:.0f}%% interval over N resamples of whole scenes (e.g. 200)")


def parse_headings(value: str) -> list[float]:
    try:
        out = [float(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(h) for h in out):
        raise ConfigError(f"--headings must be comma-separated degrees, got {value!r}")
    return out


def evaluate_real(root: str | Path, pipeline, *, fov: float = DEFAULT_FOV, max_range: float = DEFAULT_RANGE,
                  headings: Sequence[float] = DEFAULT_HEADINGS, min_points: int = DEFAULT_MIN_POINTS,
                  ) -> tuple[dict[str, EvalResult], list[RealView], list[FrameBoxes]]:
    """AP of ``pipeline`` (a DetectionPipeline) on the labelled scans in ``root``, per source and pooled
    ("all"), with the views and detections it scored (for pictures)."""
    classes = pipeline.cfg.classes
    views = load_real_dir(root, fov, max_range, headings, min_points, classes)
    dets = detect_views(views, scan_detector(pipeline))
    return evaluate_views(views, dets, classes, fov, max_range), views, dets


def parse_cross_validate(items: Sequence[str], option: str = "--cross-validate") -> dict[str, str]:
    """["kitti=A.safetensors", "av2=K.safetensors"] -> {source: weights}."""
    out: dict[str, str] = {}
    for item in items:
        src, sep, path = str(item).partition("=")
        src = src.strip()
        if not sep or not src or not path.strip():
            raise ConfigError(f"{option} takes SOURCE=WEIGHTS, got {item!r}")
        if src in out:
            raise ConfigError(f"{option} names source {src!r} twice")
        if not Path(path).is_file():
            raise ConfigError(f"{option} {src}: no weights file {path}")
        out[src] = path
    return out


def _names_a_source(item: str) -> bool:
    """SOURCE=WEIGHTS (a source is a bare name) rather than a weights path that holds '=' (``runs/lr=2e-4/x``)."""
    if Path(item).is_file():
        return False
    src, sep, _ = str(item).partition("=")
    return bool(sep) and bool(src.strip()) and not Path(src).parent.parts and "." not in src


def parse_paired_with(items: Sequence[str] | str | None, folds: dict[str, str]) -> dict[str, str] | str | None:
    """--paired-with: None, one WEIGHTS|MODEL, or (with --cross-validate) {source: weights} of other folds."""
    items = [items] if isinstance(items, str) else list(items or [])
    if not items:
        return None
    if any(_names_a_source(i) for i in items):
        if not folds:
            raise ConfigError("--paired-with SOURCE=WEIGHTS compares cross-validated folds: give --cross-validate too")
        return parse_cross_validate(items, "--paired-with")
    if len(items) > 1:
        raise ConfigError(f"--paired-with takes one WEIGHTS or MODEL (or SOURCE=WEIGHTS per source), got {items}")
    return items[0]


def seen_sources(weights: str | Path | None) -> tuple[str, ...]:
    """The real sources a weights file was trained on (its metadata), () if none or unreadable."""
    if not weights:
        return ()
    from livox_infer.detector.weights import read_metadata
    from livox_infer.detector.weights import trained_real_sources

    try:
        return trained_real_sources(read_metadata(weights))
    except Exception:  # noqa: BLE001 - a file the pipeline will refuse anyway
        return ()


def cross_validated_detections(views: Sequence[RealView], folds: dict[str, str],
                               make_pipeline: Callable[..., Any]) -> list[FrameBoxes]:
    """Detections of every view by the weights named for its source, after checking that those weights
    never saw that source (ConfigError otherwise, and for a source without weights)."""
    groups = source_groups(views)
    missing = sorted(set(groups) - set(folds))
    if missing:
        raise ConfigError(f"--cross-validate: no weights for source(s) {', '.join(missing)}")
    dets: list[FrameBoxes | None] = [None] * len(views)
    for src, weights in folds.items():
        if src in seen_sources(weights):
            raise ConfigError(f"--cross-validate {src}={weights}: these weights were trained on {src} frames; "
                              "a number on them is not accuracy")
        idx = groups.get(src, [])
        if not idx:
            continue
        fold_dets = detect_views([views[i] for i in idx], scan_detector(make_pipeline(weights)))
        for i, d in zip(idx, fold_dets):
            dets[i] = d
    return dets  # type: ignore[return-value]


def main_real(args, make_pipeline: Callable[..., Any]) -> int:
    """`livox-infer eval --real DIR`: print the AP table per source and pooled; JSON with --out.
    ``make_pipeline(weights=None)`` builds the pipeline (with other weights for --cross-validate)."""
    from livox_infer.detector.config import ModelConfig

    cfg = ModelConfig.load(args.model)
    if getattr(args, "region", None):
        raise ConfigError("--region does not apply to --real: a real view is scored in its cone (--fov, --range)")
    headings = parse_headings(args.headings)
    folds = parse_cross_validate(getattr(args, "cross_validate", None) or [])
    paired_with = parse_paired_with(getattr(args, "paired_with", None), folds)
    if paired_with is not None and not args.bootstrap:
        raise ConfigError("--paired-with gives an interval of the AP difference: give --bootstrap N too")
    thin = int(getattr(args, "thin_beams", 1))
    if thin < 1:
        raise ConfigError(f"--thin-beams must be >= 1, got {thin}")
    left_out: list[str] = []
    views = load_real_dir(args.real, args.fov, args.max_range, headings, args.min_points, cfg.classes,
                          thin_beams=thin, left_out=left_out)
    if thin > 1:
        print(f"1 laser ring in {thin} kept (--thin-beams {thin}), each view scored {thin} times (rings 0, {thin}, ...; "
              f"1, {thin + 1}, ...; ...); {len(left_out)} frame(s) left out, their rings not in the file order"
              f"{': ' + ', '.join(left_out) if left_out else ''}")
    if folds:
        dets = cross_validated_detections(views, folds, make_pipeline)
        how = "cross-validated (" + ", ".join(f"{s} by {Path(w).name}" for s, w in folds.items()) + ")"
    else:
        pipe = make_pipeline()
        dets = detect_views(views, scan_detector(pipe))
        how = f"model {cfg.name}"
        seen = sorted(set(seen_sources(getattr(pipe, "weights_file", None))) & {v.source for v in views})
        if seen:
            print(f"NOTE: these weights were trained on the {', '.join(seen)} frames scored here: their rows are "
                  "not accuracy (use --cross-validate)")
    res = evaluate_views(views, dets, cfg.classes, args.fov, args.max_range)
    print(real_table(res, f"== {how} on real scans {args.real}: ±{args.fov / 2:g}°, ≤ {args.max_range:g} m, "
                          f"AP R40, GT with < {args.min_points} points ignored =="))
    print(beyond_grid(views, cfg.classes, eval_region(args, cfg)))
    by_range = {}
    for label, rb in range_bins(parse_ranges(getattr(args, "ranges", None))):
        r = evaluate_views(views, dets, cfg.classes, args.fov, args.max_range, range_bin=rb)
        print(real_table(r, f"-- objects at {label} from the sensor --"))
        by_range[label] = {k: v.to_dict() for k, v in r.items()}
    extra = reliability_report(views, dets, cfg, args) if (args.reliability or args.fit_calibration) else None
    confusion = None
    if getattr(args, "confusion", False):
        from livox_infer.evaluation.confusion import confusion_report

        confusion = confusion_report(_in_view(views, dets, args.fov, args.max_range), [v.gt for v in views],
                                     [v.gt_ignore for v in views], cfg.classes, "the real views")
    intervals, paired = None, None
    if args.bootstrap:
        intervals = bootstrap_intervals(views, dets, cfg.classes, args.bootstrap, fov=args.fov, max_range=args.max_range)
        print(interval_table(intervals, args.bootstrap, BOOTSTRAP_LEVEL))
        if paired_with is not None:
            if isinstance(paired_with, dict):  # other fold weights, each scoring the source it never saw
                base = cross_validated_detections(views, paired_with, make_pipeline)
                name = "the folds " + ", ".join(f"{s} by {Path(w).name}" for s, w in paired_with.items())
            else:
                # a weights file of this model, or another model by name (lite-sim: three classes, its own thresholds)
                other = not Path(paired_with).is_file()
                base_pipe = make_pipeline(model=paired_with) if other else make_pipeline(paired_with)
                if set(seen_sources(base_pipe.weights_file)) & {v.source for v in views}:
                    raise ConfigError(f"--paired-with {paired_with}: these weights were trained on frames scored here")
                base = detect_views(views, scan_detector(base_pipe))
                name = Path(paired_with).name
            diff = paired_bootstrap(views, dets, base, cfg.classes, args.bootstrap, fov=args.fov,
                                    max_range=args.max_range)
            print(interval_table(diff, args.bootstrap, BOOTSTRAP_LEVEL, f" of the AP difference to {name}"))
            paired = {"weights": paired_with, "difference": diff}
    if args.bev_dir:
        save_view_pictures(views, dets, cfg.classes, Path(args.bev_dir), args.fov, args.max_range)
    if args.out:
        out = {"real": str(args.real), "fov": args.fov, "range": args.max_range, "headings": headings,
               "min_points": args.min_points, "score_threshold": args.score_threshold, "refine": not args.no_refine,
               "thin_beams": thin, "left_out": left_out,
               "bev_extent": getattr(args, "bev_extent", None),
               "views": [{"frame": v.frame, "heading": v.heading_deg, **({"rings_from": v.rings_from} if thin > 1 else {})}
                         for v in views],
               "cross_validate": folds or None,
               f"model {cfg.name}": {k: r.to_dict() for k, r in res.items()}}
        if by_range:
            out["by_range"] = by_range
        if extra is not None:
            out["reliability"] = extra
        if confusion is not None:
            out["confusion"] = confusion
        if intervals is not None:
            out["bootstrap"] = {"resamples": args.bootstrap, "level": BOOTSTRAP_LEVEL, "unit": "scene", "all": intervals}
            if paired is not None:
                out["bootstrap"]["paired"] = paired
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    return 0


def save_view_pictures(views: Sequence[RealView], dets: Sequence[FrameBoxes], classes: Sequence[str], out_dir: Path,
                       fov: float, max_range: float) -> list[Path]:
    """One BEV PNG per view: points, labelled boxes (dashed; grey = ignored) and detections (solid)."""
    from livox_infer.tools.bev_plot import save_bev_png

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    half = max_range * math.sin(math.radians(fov / 2.0)) if fov < 180 else max_range
    extent = (0.0 if fov <= 180 else -max_range, max_range, -half, half)
    for v, d in zip(views, dets):
        path = out_dir / f"{v.frame}_h{v.heading_deg:03.0f}{f'_r{v.rings_from}' if v.rings_from else ''}.png"
        names = [classes[i] for i in d.labels]
        gt_names = [classes[i] for i in v.gt.labels]
        save_bev_png(path, v.points, d.boxes, names, d.scores, extent,
                     title=f"{v.frame} heading {v.heading_deg:g}°: {len(d.boxes)} detections, "
                           f"{int((~v.gt_ignore).sum())} labelled objects (dashed)",
                     gt=(v.gt.boxes, gt_names, v.gt_ignore))
        paths.append(path)
    return paths


def reliability_report(views: Sequence[RealView], dets: Sequence[FrameBoxes], cfg, args) -> dict[str, Any]:
    """--reliability / --fit-calibration: print the reliability table, the operating points and the AP of
    what a user sees (detections at the operating thresholds); write the fitted calibration if asked."""
    import yaml

    from livox_infer.evaluation.calibration import (
        best_f1_threshold, compose, cross_fitted_ece, expected_calibration_error, fit_knots, operating_points, outcomes,
        reliability, reliability_table,
    )

    in_view = _in_view(views, dets, args.fov, args.max_range)
    res = outcomes(in_view, [v.gt for v in views], [v.gt_ignore for v in views], cfg.classes)
    print(reliability_table(res, "== reliability: score bin -> detections: share right (car BEV IoU >= 0.5, "
                                 "pedestrian / cyclist >= 0.25) =="))
    thresholds = dict(zip(cfg.classes, cfg.score_thresholds))
    pooled = evaluate_views(views, dets, cfg.classes, args.fov, args.max_range)["all"]
    ops = operating_points(res, thresholds, pooled.num_gt)
    kept = [FrameBoxes(d.boxes[m], d.labels[m], d.scores[m]) for d in dets
            for m in [d.scores >= np.asarray(cfg.score_thresholds, np.float32)[d.labels]]]
    at_op = evaluate_views(views, kept, cfg.classes, args.fov, args.max_range)["all"]
    print("== at the operating thresholds (what a user sees) ==")
    for c, o in ops.items():
        aps = at_op.ap.get(c, {})
        print(f"{c:<11} threshold {o['threshold']:.2f}: {o['detections']} detections, precision {o['precision']:.2f}, "
              f"recall {o['recall']:.2f}; AP " + ", ".join(f"{k} {aps[k]:.3f}" for k in ("bev@0.5", "bev@0.25", "bev@0.7")
                                                         if k in aps))
    best = {c: best_f1_threshold(*res[c], pooled.num_gt.get(c, 0)) for c in cfg.classes}
    print("best-F1 thresholds on these detections: " + ", ".join(
        f"{c} {b['threshold']:.2f} (precision {b['precision']:.2f}, recall {b['recall']:.2f})" for c, b in best.items()
        if b["f1"] >= 0))
    out = {"best_f1": best, "bins": {c: reliability(*r) for c, r in res.items()},
           "ece": {c: expected_calibration_error(*r) for c, r in res.items()},
           "operating": ops, "ap_at_operating": at_op.ap}
    if args.fit_calibration:
        old = dict(zip(cfg.classes, cfg.score_calibration)) if cfg.score_calibration else {}
        table = {}
        for c, (sc, right) in res.items():
            knots = fit_knots(sc, right)
            if knots is not None:
                table[c] = compose(knots, old.get(c))
        # judged on detections each fit never saw: fit on one source's detections, score the other's
        per_src = {src: outcomes([in_view[i] for i in idx], [views[i].gt for i in idx],
                                 [views[i].gt_ignore for i in idx], cfg.classes)
                   for src, idx in sorted(source_groups(views).items())}
        held_out = {}
        print("== the fit judged on held-out detections: per source, fitted on the other sources' detections; "
              "ECE before -> after, mean over the sources weighted by detections ==")
        for c in cfg.classes:
            cf = cross_fitted_ece({src: res_src[c] for src, res_src in per_src.items()})
            if cf is None:
                print(f"{c:<11} too few detections to fit on any source's complement")
                continue
            held_out[c] = cf
            print(f"{c:<11} ECE {cf['ece_before']:.3f} -> {cf['ece_after']:.3f} (" + "; ".join(
                f"{src}: {d['detections']} detections, {d['ece_before']:.3f} -> {d['ece_after']:.3f}, fitted on "
                f"{d['fitted_on']}" for src, d in cf["sources"].items()) + ")")
        out["held_out_fit"] = held_out
        counts = ", ".join(f"{c} {len(res[c][0])}" for c in cfg.classes)
        Path(args.fit_calibration).write_text(
            f"# fitted by livox-infer eval --real --fit-calibration on {counts} detections\n"
            + yaml.safe_dump({"score_calibration": table}, default_flow_style=None, sort_keys=False))
        print(f"calibration for {', '.join(table) or 'no class'} written to {args.fit_calibration}")
        out["fitted"] = table
    return out
