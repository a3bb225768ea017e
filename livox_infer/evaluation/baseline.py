"""Non-learned baseline: ground removal, grid connected components, min-area box fit, size rules.

Steps: (1) ground height per 2 m cell (10th-percentile z, falling back to the sensor height);
points 0.25..3.0 m above it are obstacles. (2) Obstacle points on a 0.25 m BEV grid; 8-connected
components of occupied cells are clusters. (3) Per cluster a minimum-area rectangle (yaw searched in
2 deg steps) and height from the local ground to the highest point. (4) Class by size: car, cyclist,
pedestrian, else dropped. Partially seen cars (Livox sees one or two sides) are grown to a typical
car size away from the sensor. Score grows with the number of points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from livox_infer.errors import ConfigError, PointCloudError
from livox_infer.params import DEFAULTS


@dataclass
class BaselineDetections:
    boxes: np.ndarray  # (M, 7) f32, input frame
    labels: np.ndarray  # (M,) int64
    scores: np.ndarray  # (M,) f32


def connected_components(occupied: np.ndarray) -> np.ndarray:
    """8-connected component labels of a 2-D bool grid: -1 for empty, else the smallest flat index."""
    h, w = occupied.shape
    big = np.iinfo(np.int64).max
    lab = np.where(occupied, np.arange(h * w, dtype=np.int64).reshape(h, w), big)
    while True:
        prev = lab
        pad = np.pad(lab, 1, constant_values=big)
        m = lab
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    m = np.minimum(m, pad[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w])
        lab = np.where(occupied, m, big)
        # pointer jumping: follow labels to their own labels (they are flat indices of cells)
        flat = lab.reshape(-1)
        for _ in range(4):
            valid = flat != big
            nxt = flat.copy()
            nxt[valid] = flat[flat[valid]]
            flat = np.minimum(flat, nxt)
        lab = flat.reshape(h, w)
        if np.array_equal(lab, prev):
            break
    return np.where(occupied, lab, -1)


def min_area_rectangle(xy: np.ndarray, step_deg: float = 2.0) -> tuple[float, float, float, float, float]:
    """(cx, cy, length, width, yaw) of the smallest-area rectangle over yaw in [0, 90) deg; length >= width."""
    angles = np.deg2rad(np.arange(0.0, 90.0, step_deg))
    c, s = np.cos(angles), np.sin(angles)
    u = xy[:, :1] * c + xy[:, 1:2] * s  # (N, A)
    v = -xy[:, :1] * s + xy[:, 1:2] * c
    du = u.max(0) - u.min(0)
    dv = v.max(0) - v.min(0)
    k = int(np.argmin(du * dv))
    uc = 0.5 * (u[:, k].max() + u[:, k].min())
    vc = 0.5 * (v[:, k].max() + v[:, k].min())
    cx, cy = uc * c[k] - vc * s[k], uc * s[k] + vc * c[k]
    a, ln, wd = angles[k], du[k], dv[k]
    if wd > ln:
        ln, wd, a = wd, ln, a + math.pi / 2
    a = (a + math.pi / 2) % math.pi - math.pi / 2  # boxes are symmetric: heading mod pi
    return float(cx), float(cy), float(ln), float(wd), float(a)


class BaselineDetector:
    """detect(points (N,4)) -> BaselineDetections. sensor_height in metres or "auto"."""

    def __init__(self, sensor_height: float | str = DEFAULTS["sensor_height"], cell: float = 0.25, x_range=(0.0, 80.0),
                 y_range=(-40.0, 40.0), min_points: int = 8) -> None:
        if not (sensor_height == "auto" or (isinstance(sensor_height, (int, float)) and math.isfinite(sensor_height))):
            raise ConfigError(f"sensor_height must be metres or 'auto', got {sensor_height!r}")
        if cell <= 0:
            raise ConfigError(f"cell must be positive, got {cell}")
        self.sensor_height, self.cell = sensor_height, float(cell)
        self.x_range, self.y_range, self.min_points = tuple(x_range), tuple(y_range), int(min_points)

    def _ground(self, p: np.ndarray, default_z: float) -> np.ndarray:
        """Local ground z under each point (10th percentile per 2 m cell with >= 10 points)."""
        gc = 2.0
        ix = np.floor((p[:, 0] - self.x_range[0]) / gc).astype(np.int64)
        iy = np.floor((p[:, 1] - self.y_range[0]) / gc).astype(np.int64)
        ny = int(math.ceil((self.y_range[1] - self.y_range[0]) / gc))
        key = ix * ny + iy
        order = np.lexsort((p[:, 2], key))
        ks = key[order]
        starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        counts = np.diff(np.r_[starts, ks.size])
        low = p[order, 2][starts + (counts * 0.1).astype(np.int64)]
        # a cell whose low point is far above the expected ground shows no ground (wall, car)
        ok = (counts >= 10) & (np.abs(low - default_z) < 0.6)
        ground_of_cell = np.where(ok, low, default_z)
        per_point = np.empty(p.shape[0], np.float64)
        per_point[order] = np.repeat(ground_of_cell, counts)
        return per_point

    def detect(self, points) -> BaselineDetections:
        from livox_infer.ground import estimate_sensor_height

        p = np.asarray(points, dtype=np.float32)
        if p.ndim != 2 or p.shape[1] < 3:
            raise PointCloudError(f"points must have shape (N, 4), got {p.shape}")
        p = p[np.all(np.isfinite(p[:, :3]), axis=1) & np.any(p[:, :3] != 0, axis=1)]
        if self.sensor_height == "auto":
            h = estimate_sensor_height(p)
            h = DEFAULTS["sensor_height"] if h is None else h
        else:
            h = float(self.sensor_height)
        empty = BaselineDetections(np.zeros((0, 7), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))
        x0, x1 = self.x_range
        y0, y1 = self.y_range
        p = p[(p[:, 0] >= x0) & (p[:, 0] < x1) & (p[:, 1] >= y0) & (p[:, 1] < y1)]
        if p.shape[0] == 0:
            return empty
        ground = self._ground(p, -h)
        above = p[:, 2] - ground
        sel = (above > 0.25) & (above < 3.0)
        p, ground = p[sel], ground[sel]
        if p.shape[0] == 0:
            return empty
        w = int(math.ceil((x1 - x0) / self.cell))
        hh = int(math.ceil((y1 - y0) / self.cell))
        ix = np.clip(((p[:, 0] - x0) / self.cell).astype(np.int64), 0, w - 1)
        iy = np.clip(((p[:, 1] - y0) / self.cell).astype(np.int64), 0, hh - 1)
        occ = np.zeros((hh, w), bool)
        occ[iy, ix] = True
        lab = connected_components(occ)[iy, ix]
        order = np.argsort(lab, kind="stable")
        ls = lab[order]
        starts = np.flatnonzero(np.r_[True, ls[1:] != ls[:-1]])
        ends = np.r_[starts[1:], ls.size]
        boxes, labels, scores = [], [], []
        for a, b in zip(starts, ends):
            if b - a < self.min_points:
                continue
            q = p[order[a:b]]
            g = float(np.median(ground[order[a:b]]))
            cx, cy, ln, wd, yaw = min_area_rectangle(q[:, :2].astype(np.float64))
            height = float(q[:, 2].max() - g)
            cls = self._classify(ln, wd, height)
            if cls is None:
                continue
            if cls == 0:  # grow a partially seen car away from the sensor to a typical size
                cx, cy, ln, wd = self._grow_car(cx, cy, ln, wd, yaw)
            boxes.append([cx, cy, g + height / 2, ln, wd, height, yaw])
            labels.append(cls)
            scores.append(0.3 + 0.7 * min(1.0, (b - a) / 150.0))
        if not boxes:
            return empty
        return BaselineDetections(np.asarray(boxes, np.float32), np.asarray(labels, np.int64), np.asarray(scores, np.float32))

    @staticmethod
    def _classify(length: float, width: float, height: float) -> int | None:
        if 0.9 <= height <= 2.4 and 1.4 <= length <= 6.5 and 0.4 <= width <= 2.6 and length >= 2.4 or (
            1.0 <= height <= 2.4 and 1.3 <= width <= 2.6 and length <= 6.5
        ):
            return 0
        if 1.0 <= height <= 2.1 and 1.2 <= length <= 2.3 and width <= 1.1:
            return 2
        if 1.0 <= height <= 2.1 and length <= 1.2 and width <= 1.2:
            return 1
        return None

    @staticmethod
    def _grow_car(cx: float, cy: float, ln: float, wd: float, yaw: float):
        tl, tw = max(ln, 4.3), max(wd, 1.8)
        c, s = math.cos(yaw), math.sin(yaw)
        away = np.array([cx, cy]) / max(1e-6, math.hypot(cx, cy))
        # shift the centre along each box axis, away from the sensor, by half the added extent
        sign_l = 1.0 if (c * away[0] + s * away[1]) >= 0 else -1.0
        sign_w = 1.0 if (-s * away[0] + c * away[1]) >= 0 else -1.0
        dl, dw = (tl - ln) / 2 * sign_l, (tw - wd) / 2 * sign_w
        return cx + c * dl - s * dw, cy + s * dl + c * dw, tl, tw
