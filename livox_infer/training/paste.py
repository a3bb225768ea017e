"""Object pasting ("GT sampling") for training: objects cut from other frames are inserted into a frame.

Rare classes (cyclists above all) get many more examples per step, and each example sits in a new
context. To keep pasted objects physically plausible:

* Objects are cut and pasted in the *levelled* frame (ground at z = 0, see ground.py) and stay at the
  position, distance and bearing they were scanned from, so their point density and self-occlusion
  remain right for that place. The database is kept per sensor model: a Horizon object is never
  pasted into an Avia scan (their scan patterns differ).
* A paste is rejected where it would collide with a labelled box (or another pasted one) or where the
  target scene has points above the ground inside the box (a wall, a tree, a parked truck).
* Occlusion is redone in the target scene on an angular grid seen from the sensor: scene points behind
  the pasted object are removed, pasted points behind closer scene points are removed (and the paste
  is dropped when fewer than ``min_points`` remain).
* Ground points are not part of a cut object (points less than ``GROUND_CLEARANCE`` above the box
  bottom are left out), so the target's own ground stays below it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.evaluation.real import turn
from livox_infer.ground import level_boxes, level_points
from livox_infer.training.frame import points_with_age

GROUND_CLEARANCE = 0.08  # m above the box bottom: ground returns (noise ~2 cm) are not cut with the object
BOX_MARGIN = 0.1  # m added to l / w when cutting: returns on the outline still belong to the object
ANGLE_BIN = math.radians(0.3)  # occlusion grid seen from the sensor
OCCLUSION_SLACK = 0.3  # m: a scene point this much nearer than the object hides it (and vice versa)
FREE_SPACE_POINTS = 3  # a candidate place with more scene points above the ground inside the box is taken
PEDESTRIAN = CLASS_NAMES.index("pedestrian")
# --paste-beside-structure: a pedestrian is turned about the sensor to stand 0.3-1.0 m beside a scene point that rises
# 0.3-2.5 m above the ground at its own range (a wall, pole, shrub, parked car, another person), as real ones stand
BESIDE_GAP = (0.3, 1.0)  # m from the box side to the structure
BESIDE_HEIGHT = (0.3, 2.5)  # m above the box bottom: what counts as structure
BESIDE_RANGE = 1.0  # m: the structure lies this close to the pedestrian's range (its density stays right)
BESIDE_TRIES = 8


@dataclass
class CutObject:
    points: np.ndarray  # (n, 4) f32, levelled frame of the source scan, at the original place
    box: np.ndarray  # (7,) f32, levelled frame
    label: int


@dataclass
class PasteConfig:
    """Per class (index): how many objects to try to paste into a frame (uniform 0..max), minimum points
    for an object to enter the database and to survive occlusion; ``probability``: share of frames pasted into."""

    max_per_frame: tuple[int, ...] = (2, 3, 4, 1, 1)  # car, pedestrian, cyclist, truck, bus (CLASS_NAMES order)
    min_points: tuple[int, ...] = (30, 8, 10, 40, 40)
    probability: float = 0.6
    max_objects_per_class: int = 6000
    # > 0: real objects (cut from real labelled views, `Frame.real`) are kept apart, every one of them (cars too), and
    # each paste draws from them with this probability where the frame's scan pattern has some; 0: they share the
    # simulated objects' lists (a few dozen real among thousands: rarely drawn)
    real_share: float = 0.0
    # > 0: share of pasted pedestrians turned about the sensor (same range, so the same point density) to stand beside
    # structure of the target scene (`BESIDE_*`); 0: every paste at the object's own place
    beside_share: float = 0.0
    extra: dict = field(default_factory=dict)


def box_point_mask(points: np.ndarray, box: np.ndarray, margin: float = 0.0, z_min: float | None = None) -> np.ndarray:
    """Mask of the points inside the rotated box (l, w grown by ``margin``), above ``z_min`` if given."""
    x, y, z, l, w, h, yaw = (float(v) for v in box)
    r = 0.5 * math.hypot(l + margin, w + margin)
    lo = z - h / 2 if z_min is None else z_min
    m = (np.abs(points[:, 0] - x) <= r) & (np.abs(points[:, 1] - y) <= r)
    m &= (points[:, 2] >= lo) & (points[:, 2] <= z + h / 2)
    idx = np.flatnonzero(m)
    if idx.size:
        dx, dy = points[idx, 0] - x, points[idx, 1] - y
        c, s = math.cos(yaw), math.sin(yaw)
        inside = (np.abs(c * dx + s * dy) <= (l + margin) / 2) & (np.abs(-s * dx + c * dy) <= (w + margin) / 2)
        m[idx[~inside]] = False
    return m


class ObjectDatabase:
    """Objects cut from training frames, per sensor model and class."""

    def __init__(self, frames, num_classes: int, cfg: PasteConfig | None = None, seed: int = 0,
                 age_column: bool = False) -> None:
        """``age_column``: cut the points with their ages in the fourth column (`points_with_age`), as a model
        with ``grid.age_channel_s`` is trained."""
        self.cfg = cfg or PasteConfig()
        self.num_classes = num_classes
        self.objects: dict[str, list[list[CutObject]]] = {}
        self.real_objects: dict[str, list[list[CutObject]]] = {}  # filled only with cfg.real_share > 0
        rng = np.random.default_rng(seed)
        for f in frames:
            if f.boxes.shape[0] == 0:
                continue
            apart = self.cfg.real_share > 0 and f.real
            per = (self.real_objects if apart else self.objects).setdefault(f.sensor, [[] for _ in range(num_classes)])
            # cars are plentiful: skip most frames for them to bound the database size and build time (real cars
            # kept apart are few: all of them)
            take_cars = rng.random() < 0.25 or apart
            wanted = [i for i in range(f.boxes.shape[0])
                      if 0 <= f.labels[i] < num_classes and (f.labels[i] != 0 or take_cars)]
            if not wanted:
                continue
            pts = level_points(points_with_age(f) if age_column else f.points, f.mount)
            boxes = level_boxes(f.boxes, f.mount)
            for i in wanted:
                c = int(f.labels[i])
                if len(per[c]) >= self.cfg.max_objects_per_class:
                    continue
                b = boxes[i]
                m = box_point_mask(pts, b, BOX_MARGIN, z_min=float(b[2] - b[5] / 2 + GROUND_CLEARANCE))
                if np.count_nonzero(m) >= self.cfg.min_points[c]:
                    per[c].append(CutObject(np.ascontiguousarray(pts[m]), b.copy(), c))

    def count(self, sensor: str | None = None, real: bool | None = None) -> list[int]:
        """Objects per class (of ``sensor``; ``real``: only those kept apart as real, False: only the others)."""
        out = [0] * self.num_classes
        stores = [self.objects, self.real_objects] if real is None else [self.real_objects if real else self.objects]
        for store in stores:
            for s, per in store.items():
                if sensor is None or s == sensor:
                    for c in range(self.num_classes):
                        out[c] += len(per[c])
        return out


def _angles(points: np.ndarray, sensor_z: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(azimuth bin, elevation bin, range) of points seen from the sensor at (0, 0, sensor_z), levelled frame."""
    d = points[:, :3].astype(np.float64) - (0.0, 0.0, sensor_z)
    rho = np.hypot(d[:, 0], d[:, 1])
    az = np.floor(np.arctan2(d[:, 1], d[:, 0]) / ANGLE_BIN).astype(np.int64)
    el = np.floor(np.arctan2(d[:, 2], rho) / ANGLE_BIN).astype(np.int64)
    return az, el, np.sqrt(rho * rho + d[:, 2] * d[:, 2])


def _cell_key(az: np.ndarray, el: np.ndarray) -> np.ndarray:
    return (az + 4096) * 8192 + (el + 4096)


def _silhouette_mask(oaz: np.ndarray, oel: np.ndarray, saz: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """Scene points inside the object's silhouette: per azimuth column, the object's elevation span
    (columns widened by one bin each side), so the gaps of a sparse scan of the object still hide
    what is behind it."""
    az0 = int(oaz.min())
    n = int(oaz.max()) - az0 + 1
    lo = np.full(n + 2, np.iinfo(np.int64).max)
    hi = np.full(n + 2, np.iinfo(np.int64).min)
    np.minimum.at(lo, oaz - az0 + 1, oel)
    np.maximum.at(hi, oaz - az0 + 1, oel)
    lo = np.minimum(np.minimum(lo, np.roll(lo, 1)), np.roll(lo, -1))  # widen: columns -1 .. n
    hi = np.maximum(np.maximum(hi, np.roll(hi, 1)), np.roll(hi, -1))
    col = saz - az0 + 1
    inside = (col >= 0) & (col < n + 2)
    c = np.clip(col, 0, n + 1)
    return inside & (sel >= lo[c]) & (sel <= hi[c])


def _circle_overlap(box: np.ndarray, others: list[np.ndarray], gap: float = 0.3) -> bool:
    r = 0.5 * math.hypot(box[3], box[4])
    for o in others:
        if math.hypot(box[0] - o[0], box[1] - o[1]) < r + 0.5 * math.hypot(o[3], o[4]) + gap:
            return True
    return False


def _turned(obj: CutObject, angle: float) -> CutObject:
    """``obj`` turned by ``angle`` (radians) about the sensor's vertical axis (the levelled frame's z axis)."""
    heading = -math.degrees(angle)  # `turn` brings a heading forward: it rotates by minus that
    return CutObject(turn(obj.points, heading), turn(obj.box[None], heading, boxes=True)[0], obj.label)


def _beside_structure(obj: CutObject, pts: np.ndarray, keep: np.ndarray, rho: np.ndarray,
                      rng: np.random.Generator) -> CutObject:
    """``obj`` turned to stand ``BESIDE_GAP`` from a structure point of the scene at its own range (within the scan's
    field of view, since that point was scanned), with its box free; ``obj`` itself where no try finds a place."""
    r_obj = math.hypot(float(obj.box[0]), float(obj.box[1]))
    if r_obj < 1.0:
        return obj
    bottom = float(obj.box[2] - obj.box[5] / 2)
    cand = np.flatnonzero(keep & (np.abs(rho - r_obj) < BESIDE_RANGE) & (pts[:, 2] > bottom + BESIDE_HEIGHT[0])
                          & (pts[:, 2] < bottom + BESIDE_HEIGHT[1]))
    if cand.size == 0:
        return obj
    half = 0.5 * float(max(obj.box[3], obj.box[4]))
    az_obj = math.atan2(float(obj.box[1]), float(obj.box[0]))
    for j in rng.choice(cand, size=min(BESIDE_TRIES, cand.size), replace=False):
        side = (half + rng.uniform(*BESIDE_GAP)) * (1.0 if rng.random() < 0.5 else -1.0)
        az = math.atan2(float(pts[j, 1]), float(pts[j, 0])) + side / r_obj
        turned = _turned(obj, az - az_obj)
        if np.count_nonzero(box_point_mask(pts, turned.box, 2 * BESIDE_GAP[0], z_min=bottom + 0.2) & keep) \
                <= FREE_SPACE_POINTS:
            return turned
    return obj


def paste_objects(frame, db: ObjectDatabase, rng: np.random.Generator):
    """A new Frame (levelled: mount height 0, up = e_z) with objects from ``db`` pasted in, or ``frame``
    itself when nothing is pasted this time."""
    per = db.objects.get(frame.sensor)
    real = db.real_objects.get(frame.sensor)
    cfg = db.cfg
    if (per is None and real is None) or rng.random() >= cfg.probability:
        return frame
    picks: list[CutObject] = []
    for c in range(db.num_classes):
        if real is None:
            n = int(rng.integers(0, cfg.max_per_frame[c] + 1)) if per[c] else 0
            for j in rng.integers(0, len(per[c]), size=n) if n else ():
                picks.append(per[c][int(j)])
            continue
        sim_c, real_c = (per[c] if per is not None else []), real[c]
        if not sim_c and not real_c:
            continue
        for _ in range(int(rng.integers(0, cfg.max_per_frame[c] + 1))):
            pool = real_c if real_c and (not sim_c or rng.random() < cfg.real_share) else sim_c
            picks.append(pool[int(rng.integers(0, len(pool)))])
    if not picks:
        return frame
    pts = level_points(frame.points, frame.mount)
    boxes = list(level_boxes(frame.boxes, frame.mount))
    labels = list(frame.labels)
    sensor_z = float(frame.mount.height)
    keep = np.ones(pts.shape[0], bool)
    saz, sel, srng = _angles(pts, sensor_z)
    skey = _cell_key(saz, sel)
    rho = np.hypot(pts[:, 0], pts[:, 1]) if cfg.beside_share > 0 else None
    added = []
    for obj in picks:
        if obj.label == PEDESTRIAN and cfg.beside_share > 0 and rng.random() < cfg.beside_share:
            obj = _beside_structure(obj, pts, keep, rho, rng)
        if _circle_overlap(obj.box, boxes):
            continue
        above = box_point_mask(pts, obj.box, BOX_MARGIN, z_min=float(obj.box[2] - obj.box[5] / 2 + 0.2)) & keep
        if np.count_nonzero(above) > FREE_SPACE_POINTS:
            continue
        # occlusion on the angular grid seen from the sensor: scene points nearer than the object in
        # the same cell hide object points; the object's silhouette hides the scene behind it
        oaz, oel, orng = _angles(obj.points, sensor_z)
        # (a scene point counts for its cell and the 8 around it: the scan is sparser than the grid)
        cells, inv = np.unique(_cell_key(oaz, oel), return_inverse=True)
        near_scene = np.full(cells.size, np.inf)
        for da in (-1, 0, 1):
            for de in (-1, 0, 1):
                key = skey + (da * 8192 + de)
                pos = np.clip(np.searchsorted(cells, key), 0, cells.size - 1)
                hit = (cells[pos] == key) & keep
                np.minimum.at(near_scene, pos[hit], srng[hit])
        visible = orng < near_scene[inv] - OCCLUSION_SLACK
        if np.count_nonzero(visible) < cfg.min_points[obj.label]:
            continue
        keep &= ~(_silhouette_mask(oaz[visible], oel[visible], saz, sel) & (srng > orng[visible].min()))
        keep &= ~box_point_mask(pts, obj.box, BOX_MARGIN, z_min=float(obj.box[2] - obj.box[5] / 2 + GROUND_CLEARANCE))
        added.append(obj.points[visible])
        boxes.append(obj.box)
        labels.append(obj.label)
    if not added:
        return frame
    out_pts = np.concatenate([pts[keep], *added]).astype(np.float32)
    return dataclasses.replace(frame, points=out_pts, boxes=np.asarray(boxes, np.float32).reshape(-1, 7),
                               labels=np.asarray(labels, np.int64), sensor_height=0.0,
                               up=np.array([0.0, 0.0, 1.0], np.float32))

