"""Train-time sparsification: make simulated objects as sparse and partial as real ones.

Measured 2026-12-03 (cars in the +-40 deg cone, median points per GT): real_dev 40-60 m 12, the simulated
S1/S2 shards 26-28; real cars lose their glass (no return) and parts in shadow of other cars.
``range_prob``: share of frames thinned with range, keep probability min(1, (range_ref / r) ** range_power);
``part_prob``: per object, chance to lose a part (car glass band, an occluded end, or a dark-paint thinning);
``part_classes``: the classes (label indices) that may lose one (None: all).
Off by default (both 0), and then no random number is drawn, so the augmentation stream is unchanged.

`scale_objects` (``object_scale``, off by default) is the other per-object augmentation: each labelled object
grows or shrinks with its box, so the size a box gets must come from the points, not from the sizes of the
training sources (real_dev's cars: KITTI median 3.78 x 1.63 m, Argoverse 2 4.24 x 1.89 m).

`thin_simulated_cars` (``sim_car_keep``, off by default) dims the simulated cars only: against a background as dense
as KITTI's (the `hdl64` proxy's frame points per range bin are within 15 % of the KITTI frames'), a simulated car
returns about 2.5 times the points of a real one beyond 30 m (median 127 / 56 at 30-40 / 40-50 m against KITTI's 49 /
23; 1.6 times at 20-30 m, about the same nearer): real paint and glass return less. Real views are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAR = 0


@dataclass(frozen=True)
class SparsifyAugment:
    range_prob: float = 0.0
    range_ref: float = 30.0  # m
    range_power: float = 1.5
    part_prob: float = 0.0
    part_classes: tuple[int, ...] | None = None
    object_scale: tuple[float, float] | None = None  # (low, high): `scale_objects`; None: off
    sim_car_keep: tuple[float, float] | None = None  # (low, high): `thin_simulated_cars`; None: off

    @property
    def enabled(self) -> bool:
        return self.range_prob > 0 or self.part_prob > 0


def thin_with_range(points: np.ndarray, rng: np.random.Generator, ref: float, power: float) -> np.ndarray:
    """Keep each point with probability min(1, (ref / range) ** power) (range in the xy plane)."""
    r = np.hypot(points[:, 0], points[:, 1])
    keep_p = np.minimum(1.0, (ref / np.maximum(r, 1e-3)) ** power)
    return points[rng.random(points.shape[0]) < keep_p]


def _local(points: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Points in the box frame (x along the length, z from the box centre)."""
    c, s = np.cos(box[6]), np.sin(box[6])
    d = points[:, :3] - box[:3]
    return np.stack([d[:, 0] * c + d[:, 1] * s, -d[:, 0] * s + d[:, 1] * c, d[:, 2]], 1)


def _indices_in_box(points: np.ndarray, order: np.ndarray, xs: np.ndarray, box: np.ndarray, reach: float) -> np.ndarray:
    """Indices of the points inside ``box`` (BEV circumradius ``reach``), looking only at those in its x band:
    ``order`` sorts the points by x, ``xs`` are those x values."""
    band = order[np.searchsorted(xs, box[0] - reach, "left"):np.searchsorted(xs, box[0] + reach, "right")]
    near = band[np.abs(points[band, 1] - box[1]) <= reach]
    return near[np.all(np.abs(_local(points[near], box)) <= np.asarray(box[3:6]) / 2, axis=1)]


def drop_object_parts(points: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
                      prob: float, classes: tuple[int, ...] | None = None) -> np.ndarray:
    """For each box with probability ``prob`` remove one part of its points: cars may lose the glass band
    (upper 35-50 % of the height); any object may lose one end (20-60 % of its length, as behind another
    object) or be thinned to 25-70 % (dark paint, dark clothes). ``classes``: only boxes of these labels (None: all;
    the others draw no random number)."""
    drop = np.zeros(points.shape[0], bool)
    for box, label in zip(boxes, labels):
        if classes is not None and int(label) not in classes:
            continue
        if rng.random() >= prob:
            continue
        loc = _local(points, box)
        half = np.asarray(box[3:6]) / 2 + 0.1
        inside = np.all(np.abs(loc) <= half, axis=1)
        mode = rng.integers(3) if label == CAR else 1 + rng.integers(2)
        if mode == 0:  # glass band: z above 50-65 % of the height
            cut = (float(rng.uniform(0.5, 0.65)) - 0.5) * box[5]
            part = loc[:, 2] > cut
        elif mode == 1:  # one end hidden
            frac = float(rng.uniform(0.2, 0.6))
            edge = box[3] * (0.5 - frac)
            part = loc[:, 0] > edge if rng.random() < 0.5 else loc[:, 0] < -edge
        else:  # dark surface: fewer returns everywhere
            part = rng.random(points.shape[0]) > rng.uniform(0.25, 0.7)
        drop |= inside & part
    return points[~drop]


def scale_objects(points: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
                  low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """Random object scaling: each box of a non-negative label and the points inside it scaled by one factor drawn
    from U(``low``, ``high``) about the middle of the box's bottom face, so the object keeps standing on the ground
    (ground returns inside the box stay at ground height). A box that would grow into another box stays as it is.
    Returns (points, boxes), new arrays. Ignored boxes (label < 0) draw no number and keep their size."""
    points = points.copy()
    boxes = np.asarray(boxes, np.float64).copy()
    reach = 0.5 * np.hypot(boxes[:, 3], boxes[:, 4])  # BEV circumradius
    order = np.argsort(points[:, 0], kind="stable")  # each box then looks only at the points in its x band
    xs = points[order, 0]
    for i in range(len(boxes)):
        if labels[i] < 0:
            continue
        f = float(rng.uniform(low, high))
        box = boxes[i]
        if f > 1.0:
            others = np.arange(len(boxes)) != i
            gap = np.hypot(boxes[others, 0] - box[0], boxes[others, 1] - box[1]) - reach[others]
            if np.any(gap < f * reach[i]):
                continue
        inside = _indices_in_box(points, order, xs, box, reach[i])
        bottom = np.array([box[0], box[1], box[2] - box[5] / 2])
        points[inside, :3] = (bottom + (points[inside, :3] - bottom) * f).astype(points.dtype)
        box[3:6] *= f
        box[2] = bottom[2] + box[5] / 2
        reach[i] *= f
    return points, boxes


def thin_simulated_cars(points: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
                        low: float, high: float, near: float = 15.0, far: float = 30.0) -> np.ndarray:
    """Each car's points (label ``CAR``) kept with one probability per car: 1 up to ``near`` metres (its centre's
    range in the xy plane), a draw k from U(``low``, ``high``) from ``far`` on, linear between. Every car draws k,
    near or far (the stream does not depend on where the cars stand); the other points stay. Returns the kept points."""
    drop = np.zeros(points.shape[0], bool)
    order = np.argsort(points[:, 0], kind="stable")  # each box looks only at the points in its x band
    xs = points[order, 0]
    for box, label in zip(boxes, labels):
        if int(label) != CAR:
            continue
        k = float(rng.uniform(low, high))
        r = float(np.hypot(box[0], box[1]))
        keep = 1.0 - (1.0 - k) * min(1.0, max(0.0, (r - near) / (far - near)))
        if keep >= 1.0:
            continue
        reach = 0.5 * float(np.hypot(box[3], box[4]))
        inside = _indices_in_box(points, order, xs, box, reach)
        drop[inside[rng.random(inside.shape[0]) >= keep]] = True
    return points[~drop]


def sparsify(points: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
             aug: SparsifyAugment) -> np.ndarray:
    """Apply ``aug`` to one frame's points (boxes in the same frame as the points)."""
    if not aug.enabled:
        return points
    if aug.part_prob > 0:
        points = drop_object_parts(points, boxes, labels, rng, aug.part_prob, aug.part_classes)
    if aug.range_prob > 0 and rng.random() < aug.range_prob:
        points = thin_with_range(points, rng, aug.range_ref, aug.range_power)
    return points
