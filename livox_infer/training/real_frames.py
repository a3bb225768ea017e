"""Real labelled scans as training frames (cross-validation by source; docs/training.md, "Real scans").

A real-scan directory (`livox_infer.evaluation.real`: point files, ``labels.json``, ``meta.json``) becomes
training `Frame` s, only for the sources asked for (``kitti``, ``av2``: the folds), so that a model trained
on one fold can be scored on the other without having seen it.

- **Views.** A scan labelled all around (AV2) gives one view per heading in ``headings_360`` (turned so the
  heading points forward, as `evaluation.real` turns its views); a scan labelled only in a cone (KITTI: the
  front camera's ~90 deg) gives one view, **cropped to that cone**: the unlabelled rest of the scan holds
  unlabelled cars and must never be trained on as background.
- **Labels.** Our classes are targets; vans are cars (KITTI's van is a car body); everything `IGNORE_AS`
  maps to one of ours (truck, bus, trailer, tram, misc, person sitting, bicycle without rider, motorcycle,
  rider, ...) is an *ignored* object (label -1): no target, and no background loss under its footprint
  (`targets.ignore_mask`). Other classes (bollards, signs, cones) are background, as real clutter is.
- **Sensor.** KITTI frames are filed under the simulator's ``hdl64`` proxy and AV2 under ``vlp32``, so object
  pasting (`paste.py`, per sensor) swaps real and simulated objects of the same scan pattern both ways:
  real objects land in simulated scenes and simulated objects in real backgrounds.
- **Mount.** Estimated from the view's points as the pipeline's "auto" mode does; the source's nominal mount
  height where that fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from livox_infer.decode.pointfiles import read_points_file
from livox_infer.errors import ConfigError
from livox_infer.evaluation.real import IGNORE_AS, POINT_SUFFIXES, labelled_fov, source_of, turn
from livox_infer.ground import Mount, estimate_mount
from livox_infer.training.frame import Frame

REAL_SOURCES = ("kitti", "av2")  # the folds: fold K = kitti (incl. kitti_000134), fold A = av2
PROXY_SENSOR = {"kitti": "hdl64", "av2": "vlp32"}  # simulator proxy with the same scan pattern (pasting)
NOMINAL_HEIGHT = {"kitti": 1.73, "av2": 2.0}  # metres to the ground (real_dev README), when estimation fails
TRAIN_AS = {"van": "car"}  # labelled and trained as this class of ours
HEADINGS_360 = tuple(float(h) for h in range(0, 360, 45))
CONE_MARGIN_DEG = 1.0  # the labelled cone is cropped this much narrower: objects cut by its edge are unlabelled
DEFAULT_SHARE = 0.5  # expected share of a batch drawn from the real views


@dataclass(frozen=True)
class RealTrainingSpec:
    """Which real scans a run trains on: ``root`` (a real-scan directory), the ``sources`` (folds) it may
    use, and ``share``: the expected share of each batch drawn from them (the rest is simulated)."""

    root: str
    sources: tuple[str, ...]
    share: float = DEFAULT_SHARE
    # share of the objects pasted into a frame drawn from the real ones of its scan pattern (0: real and simulated
    # objects alike, in proportion to their numbers: a few dozen real against thousands of simulated)
    paste_share: float = 0.0

    def check(self) -> None:
        if not self.sources:
            raise ConfigError("real training data needs at least one source (kitti, av2)")
        bad = [s for s in self.sources if s not in REAL_SOURCES]
        if bad:
            raise ConfigError(f"unknown real source(s) {bad}: choose from {', '.join(REAL_SOURCES)}")
        if not 0.0 < self.share <= 1.0:
            raise ConfigError(f"real share must be in (0, 1], got {self.share}")
        if not 0.0 <= self.paste_share <= 1.0:
            raise ConfigError(f"real paste share must be in [0, 1], got {self.paste_share}")
        if not Path(self.root).is_dir():
            raise ConfigError(f"real scans directory {self.root} does not exist")


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot load {path}: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object keyed by frame")
    return data


def training_labels(items: list, classes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(boxes (M, 7) f32, labels (M,) int64) of one frame's label list: our classes (and vans as cars) as
    their index, look-alikes of ours (`IGNORE_AS`) as -1, other classes left out (background)."""
    boxes, labels = [], []
    for b in items:
        name = str(b.get("label", "")).lower()
        name = TRAIN_AS.get(name, name)
        if name in classes:
            lab = list(classes).index(name)
        elif IGNORE_AS.get(name) in classes:
            lab = -1
        else:
            continue
        boxes.append([float(b[k]) for k in ("x", "y", "z", "l", "w", "h", "yaw")])
        labels.append(lab)
    return np.asarray(boxes, np.float32).reshape(-1, 7), np.asarray(labels, np.int64)


def _cone(points_xy: np.ndarray, half_deg: float) -> np.ndarray:
    return np.degrees(np.abs(np.arctan2(points_xy[:, 1], points_xy[:, 0]))) <= half_deg


def load_real_training_frames(spec: RealTrainingSpec, classes: Sequence[str], crop=None,
                              headings_360: Sequence[float] = HEADINGS_360):
    """Training frames (`train.Frame`) of the real scans in ``spec.root`` whose source is in ``spec.sources``.
    ``crop(points) -> points``: the training crop (grid + margin)."""
    spec.check()
    root = Path(spec.root)
    labels = _load_json(root / "labels.json")
    meta = _load_json(root / "meta.json") if (root / "meta.json").is_file() else {}
    frames = []
    for name in sorted(labels):
        src = source_of(name)
        if src not in spec.sources:
            continue
        path = next((root / f"{name}{s}" for s in POINT_SUFFIXES if (root / f"{name}{s}").is_file()), None)
        if path is None:
            raise ConfigError(f"{root}: no point file for labelled frame {name!r}")
        pts = np.asarray(read_points_file(path), np.float32)
        pts = pts[np.isfinite(pts).all(axis=1) & np.any(pts[:, :3] != 0, axis=1)]
        boxes, labs = training_labels(labels[name], classes)
        lab_fov = labelled_fov(meta.get(name))
        for h in (headings_360 if lab_fov >= 360.0 else (0.0,)):
            vp, vb = turn(pts, h), turn(boxes, h, boxes=True)
            if lab_fov < 360.0:
                half = lab_fov / 2.0 - CONE_MARGIN_DEG
                vp = vp[_cone(vp, half)]
                outside = ~_cone(vb, half) if len(vb) else np.zeros(0, bool)
                labs_h = np.where(outside, -1, labs)  # centre outside the labelled cone: ignored
            else:
                labs_h = labs.copy()
            if crop is not None:
                vp = crop(vp)
            est = estimate_mount(vp)
            nominal = NOMINAL_HEIGHT.get(src, 1.8)
            if est is None or abs(est.height - nominal) > 0.5:
                est = Mount(nominal, (0.0, 0.0, 1.0))
            frames.append(Frame(np.ascontiguousarray(vp), vb.astype(np.float32), labs_h, float(est.height),
                                np.asarray(est.up, np.float32), PROXY_SENSOR.get(src, src), real=True))
    if not frames:
        raise ConfigError(f"{root}: no labelled frame of source(s) {', '.join(spec.sources)}")
    return frames
