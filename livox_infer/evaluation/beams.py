"""Fewer beams from a real scan: keep every K-th laser ring (`livox-infer eval --real DIR --thin-beams K`).

The blind test's sensors have 32 and 40 beams, real_dev's 64; thinning real_dev's rings measures on real scenes
and real labels what fewer beams cost (docs/evaluation.md, "Fewer beams").

Rings are read from the point file's order, which is the laser's scan order in KITTI's files: laser after laser,
each one sweep of rising azimuth from the same seam (KITTI: straight ahead; ``velodyne_reduced`` keeps the
camera's ±45° of each sweep). Measured from the seam, each sweep rises through 360° and the next one starts where
the azimuth falls back. The seam is not stored: it is the azimuth where consecutive points step from one laser to
the next, so their elevations differ by a laser spacing (0.2-0.5°), where anywhere else along a sweep they differ
little. Files in another order (Argoverse 2's sweeps are stored by firing column, two lidars interleaved) give
no rings: `scan_rings` returns None and such frames are left out.
"""

from __future__ import annotations

import numpy as np

MIN_RINGS, MAX_RINGS = 16, 130
MIN_MONOTONIC = 0.9  # share of consecutive rings whose elevation steps the same way (lasers fire top to bottom)
SEAM_STEP_DEG, SEAM_FINE_DEG = 2.0, 0.1  # the seam search: every 2°, then every 0.1° around the best


def _rings(az: np.ndarray, seam: float) -> np.ndarray:
    swept = (az - seam) % 360.0
    return np.r_[0, np.cumsum(np.diff(swept) < -180.0)]


def scan_rings(points: np.ndarray) -> np.ndarray | None:
    """Ring index per point (0 = first in the file) of a scan stored in laser order, or None where the order is
    not a plausible ring sequence (too few or too many sweeps, or elevations that do not step one way)."""
    if points.shape[0] < MIN_RINGS:
        return None
    az = np.degrees(np.arctan2(points[:, 1], points[:, 0]))
    el = np.degrees(np.arctan2(points[:, 2], np.maximum(np.hypot(points[:, 0], points[:, 1]), 1e-6)))
    step_el = np.abs(np.diff(el))

    def best(candidates):
        scored = []
        for seam in candidates:
            ring = _rings(az, float(seam))
            if MIN_RINGS <= ring[-1] + 1 <= MAX_RINGS:
                # the elevation steps where this seam says a new laser starts (median: robust to range edges)
                scored.append((float(np.median(step_el[np.diff(ring) > 0])), float(seam)))
        return max(scored) if scored else None

    coarse = best(np.arange(-180.0, 180.0, SEAM_STEP_DEG))
    if coarse is None:
        return None
    _, seam = best(coarse[1] + np.arange(-SEAM_STEP_DEG, SEAM_STEP_DEG + 1e-9, SEAM_FINE_DEG))
    ring = _rings(az, seam)
    starts = np.r_[0, np.flatnonzero(np.diff(ring)) + 1, len(ring)]
    med = np.array([np.median(el[a:b]) for a, b in zip(starts[:-1], starts[1:])])
    steps = np.diff(med)
    if max(np.mean(steps < 0), np.mean(steps > 0)) < MIN_MONOTONIC:
        return None
    return ring


def thin_beams(points: np.ndarray, keep_every: int) -> list[np.ndarray] | None:
    """The scan as ``keep_every`` sensors with 1/K of its beams each: rings p, p + K, p + 2K, ... for each phase p
    (every ring in exactly one of them; which half of the lasers a 32-beam sensor would have is arbitrary, so
    scoring all phases halves that noise), or None where `scan_rings` finds no rings; K = 1: ``[points]``.
    Rows with a non-finite coordinate are dropped first (no azimuth to read)."""
    if keep_every < 1:
        raise ValueError(f"keep_every must be >= 1, got {keep_every}")
    if keep_every == 1:
        return [points]
    points = points[np.isfinite(points[:, :3]).all(axis=1)]
    rings = scan_rings(points)
    return None if rings is None else [points[rings % keep_every == p] for p in range(keep_every)]
