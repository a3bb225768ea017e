"""Person-sized background: narrow, person-height things that are not pedestrians.

Real scans put pedestrian boxes on sign posts, parking meters, thin trunks and bollards (docs/detector.md,
"Real labelled scans"); the street scene's poles are 3-9 m and its bollards under 1.1 m, so the detector never
saw a 1.2-2.2 m post as a negative. ``add_lookalikes`` scatters such things; it draws from its own generator so
scenes built without it stay bit-identical.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from livox_infer.sim.geometry import BOX, CYLINDER, ELLIPSOID, PrimitiveBuilder, rot_z

LOOKALIKE_KINDS = ("post", "meter", "sapling", "hydrant", "bollards", "cabinet", "column", "shrub")
LOOKALIKE_RADIUS = 0.6  # m: footprint kept free around each (a bollard row takes more)


def add_lookalike(b: PrimitiveBuilder, rng: np.random.Generator, x: float, y: float, z0: float,
                  kind: str | None = None) -> str:
    """One person-sized non-pedestrian standing on the ground at (x, y, z0); returns its kind."""
    kind = kind or LOOKALIKE_KINDS[int(rng.integers(len(LOOKALIKE_KINDS)))]
    yaw = float(rng.uniform(0, 2 * np.pi))
    R = rot_z(yaw)
    dull = float(rng.uniform(0.05, 0.4))
    if kind == "post":  # sign post, short pole, with a small sign on top half the time
        r, h = float(rng.uniform(0.03, 0.09)), float(rng.uniform(1.2, 2.4))
        b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=dull)
        if rng.random() < 0.5:
            s = float(rng.uniform(0.12, 0.3))
            b.add(BOX, (x, y, z0 + h - s), (0.01, s, s), R, reflect=0.8, retro=bool(rng.random() < 0.5))
    elif kind == "meter":  # parking meter / ticket machine: post with a head, or a tall narrow box
        if rng.random() < 0.5:
            h = float(rng.uniform(1.0, 1.3))
            b.add(CYLINDER, (x, y, z0 + h / 2), (0.05, 0.05, h / 2), reflect=dull)
            b.add(BOX, (x, y, z0 + h + 0.2), (0.12, 0.1, 0.22), R, reflect=dull)
        else:
            h = float(rng.uniform(1.4, 1.9))
            b.add(BOX, (x, y, z0 + h / 2), (float(rng.uniform(0.15, 0.3)), float(rng.uniform(0.12, 0.25)), h / 2),
                  R, reflect=dull)
    elif kind == "sapling":  # young tree: thin trunk, small sparse crown at person height or above
        r, h = float(rng.uniform(0.04, 0.12)), float(rng.uniform(1.2, 2.2))
        b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=float(rng.uniform(0.15, 0.3)))
        cr = float(rng.uniform(0.3, 0.9))
        b.add(ELLIPSOID, (x, y, z0 + h + cr * 0.7), (cr, cr, cr * float(rng.uniform(0.8, 1.4))),
              reflect=float(rng.uniform(0.25, 0.5)), volume_k=float(rng.uniform(0.5, 2.0)))
    elif kind == "hydrant":
        r, h = float(rng.uniform(0.1, 0.17)), float(rng.uniform(0.6, 0.95))
        b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=float(rng.uniform(0.2, 0.6)))
        b.add(CYLINDER, (x, y, z0 + h * 0.7), (0.05, r + 0.08, 0.05), R, reflect=0.4)
    elif kind == "bollards":  # a row of 2-4 at walking distance from each other
        n, gap = int(rng.integers(2, 5)), float(rng.uniform(0.9, 1.8))
        r, h = float(rng.uniform(0.06, 0.15)), float(rng.uniform(0.8, 1.3))
        for k in range(n):
            off = (k - (n - 1) / 2) * gap
            b.add(CYLINDER, (x + np.cos(yaw) * off, y + np.sin(yaw) * off, z0 + h / 2), (r, r, h / 2), reflect=dull)
    elif kind == "cabinet":  # utility / electrical cabinet
        h = float(rng.uniform(1.1, 1.7))
        b.add(BOX, (x, y, z0 + h / 2), (float(rng.uniform(0.25, 0.5)), float(rng.uniform(0.15, 0.3)), h / 2),
              R, reflect=float(rng.uniform(0.1, 0.5)))
    elif kind == "column":  # advertising column / thick trunk
        r, h = float(rng.uniform(0.2, 0.5)), float(rng.uniform(1.6, 3.0))
        b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=dull)
    else:  # shrub of person size (narrow, tall, leafy)
        r = float(rng.uniform(0.25, 0.5))
        h = float(rng.uniform(1.2, 2.0))
        b.add(ELLIPSOID, (x, y, z0 + h / 2), (r, r * float(rng.uniform(0.8, 1.2)), h / 2), reflect=0.4,
              volume_k=float(rng.uniform(1.5, 4.0)))
    return kind


def add_lookalikes(b: PrimitiveBuilder, rng: np.random.Generator, n: int,
                   sample_site: Callable[[np.random.Generator], tuple[float, float, float] | None],
                   free: Callable[[float, float, float], bool], take: Callable[[float, float, float], None]) -> int:
    """Place up to ``n`` lookalikes at sites ``sample_site(rng)`` -> (x, y, ground z) or None, where
    ``free(x, y, r)``; ``take`` records each footprint. Returns how many were placed."""
    placed = 0
    for _ in range(n):
        site = sample_site(rng)
        if site is None:
            continue
        x, y, z0 = site
        if free(x, y, LOOKALIKE_RADIUS):
            add_lookalike(b, rng, x, y, z0)
            take(x, y, LOOKALIKE_RADIUS)
            placed += 1
    return placed
