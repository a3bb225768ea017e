"""Vectorised ray casting against a scene of convex primitives plus a height-field ground.

Every primitive is an affine image of a unit shape: world point ``p = center + rot @ (half * q)`` with
``q`` in the unit shape, so one transform handles all kinds:

* ``BOX``:      |q_x|, |q_y|, |q_z| <= 1
* ``CYLINDER``: q_x^2 + q_y^2 <= 1, |q_z| <= 1 (axis along the local z; wheels rotate it sideways)
* ``ELLIPSOID``: |q| <= 1
* ``RBOX``:     box with rounded vertical edges: box and q_x^2 + q_y^2 <= ROUND^2 (car bodies)

Casting is ray-major only where it must be: rays are bucketed by (elevation bin, azimuth), each
primitive's angular window selects candidate rays with ``searchsorted``, and the candidate
(ray, primitive) pairs are intersected in one vectorised pass. Cost scales with the number of
candidate pairs (~1e5 per 24k-ray frame), not rays x primitives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BOX, CYLINDER, ELLIPSOID, RBOX = 0, 1, 2, 3
RBOX_ROUND = 1.2  # corner rounding of RBOX in unit-shape coordinates (1 = ellipse, sqrt(2) = box)

_FIELDS = ("center", "rot", "half", "kind", "reflect", "retro", "hit_prob", "volume_k", "instance")


@dataclass
class Primitives:
    """Struct of arrays, one row per primitive.

    reflect: diffuse reflectance 0..1 (for retro-reflectors: retro strength 0..1);
    retro: retro-reflective (plates, signs, lights) -> Livox reflectivity 151..255;
    hit_prob: probability that a ray crossing the surface returns from it (glass, spokes, fences < 1);
    volume_k: > 0 marks a volume (foliage) with that extinction per metre: rays stop at a random depth;
    instance: index of the labelled object the part belongs to, -1 for background.
    """

    center: np.ndarray  # (P,3) f64
    rot: np.ndarray  # (P,3,3) f64, columns = local axes in world
    half: np.ndarray  # (P,3) f64
    kind: np.ndarray  # (P,) i8
    reflect: np.ndarray  # (P,) f64
    retro: np.ndarray  # (P,) bool
    hit_prob: np.ndarray  # (P,) f64
    volume_k: np.ndarray  # (P,) f64
    instance: np.ndarray  # (P,) i32

    def __len__(self) -> int:
        return int(self.center.shape[0])

    @staticmethod
    def empty() -> "Primitives":
        return Primitives(
            np.zeros((0, 3)), np.zeros((0, 3, 3)), np.zeros((0, 3)), np.zeros(0, np.int8), np.zeros(0),
            np.zeros(0, bool), np.zeros(0), np.zeros(0), np.zeros(0, np.int32),
        )

    @staticmethod
    def concat(items: list["Primitives"]) -> "Primitives":
        items = [p for p in items if len(p)]
        if not items:
            return Primitives.empty()
        return Primitives(*[np.concatenate([getattr(p, f) for p in items]) for f in _FIELDS])

    def take(self, idx: np.ndarray) -> "Primitives":
        return Primitives(*[getattr(self, f)[idx] for f in _FIELDS])

    def world_half_extents(self) -> np.ndarray:
        """Half extents of each primitive's world axis-aligned bounding box (conservative)."""
        return np.einsum("pij,pj->pi", np.abs(self.rot), self.half)


class PrimitiveBuilder:
    """Collects primitives one by one (scene construction is per scene, not per point)."""

    def __init__(self) -> None:
        self.rows: dict[str, list] = {f: [] for f in _FIELDS}

    def add(self, kind: int, center, half, rot=None, *, reflect: float = 0.3, retro: bool = False,
            hit_prob: float = 1.0, volume_k: float = 0.0, instance: int = -1) -> None:
        r = self.rows
        r["center"].append(tuple(center))
        r["rot"].append(_EYE if rot is None else rot)
        r["half"].append(tuple(half))
        r["kind"].append(kind)
        r["reflect"].append(reflect)
        r["retro"].append(retro)
        r["hit_prob"].append(hit_prob)
        r["volume_k"].append(volume_k)
        r["instance"].append(instance)

    def build(self) -> Primitives:
        r = self.rows
        if not r["center"]:
            return Primitives.empty()
        return Primitives(
            np.array(r["center"], np.float64), np.array(r["rot"], np.float64),
            np.maximum(np.array(r["half"], np.float64), 1e-3), np.asarray(r["kind"], np.int8),
            np.asarray(r["reflect"], np.float64), np.asarray(r["retro"], bool),
            np.asarray(r["hit_prob"], np.float64), np.asarray(r["volume_k"], np.float64),
            np.asarray(r["instance"], np.int32),
        )


_EYE = np.eye(3)


def rot_z(yaw: float | np.ndarray) -> np.ndarray:
    if np.ndim(yaw) == 0:
        c, s = math.cos(yaw), math.sin(yaw)
        return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    c, s = np.cos(yaw), np.sin(yaw)
    z, o = np.zeros_like(c), np.ones_like(c)
    return np.stack([np.stack([c, -s, z], -1), np.stack([s, c, z], -1), np.stack([z, z, o], -1)], -2)


def rot_y(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rot_x(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


# ------------------------------------------------------------------------------------------ ground
@dataclass
class Ground:
    """Ground height z = gx*x + gy*y + roughness(x, y) (world frame), reflectance map with lane marks."""

    gx: float
    gy: float
    rough_amp: np.ndarray  # (K,)
    rough_k: np.ndarray  # (K,2) wave vectors, rad/m
    rough_phase: np.ndarray  # (K,)
    reflect_base: float
    marking_y: np.ndarray  # (L,) lateral positions of painted lines (world y)
    marking_half_width: float = 0.075
    marking_reflect: float = 0.55
    noise_sigma: float = 0.004  # per-point grain (gravel, cracks), m of height
    camber: float = 0.0  # road crown: the surface drops camber * y^2 (m) away from y = 0 ...
    camber_half: float = 0.0  # ... up to |y| = camber_half (the road edge), flat beyond

    def plane(self, x, y):
        return self.gx * x + self.gy * y

    def detail(self, x, y):
        """Height above the plane (waviness + road crown) and its x/y slopes."""
        if np.ndim(x) == 0 and np.ndim(y) == 0:
            return self._detail_scalar(float(x), float(y))
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        dz = np.zeros(np.broadcast(x, y).shape)
        sx = np.zeros_like(dz)
        sy = np.zeros_like(dz)
        for a, k, ph in zip(self.rough_amp, self.rough_k, self.rough_phase):
            arg = k[0] * x + k[1] * y + ph
            dz = dz + a * np.sin(arg)
            c = a * np.cos(arg)
            sx = sx + c * k[0]
            sy = sy + c * k[1]
        if self.camber > 0:
            yc = np.clip(y, -self.camber_half, self.camber_half)
            dz = dz - self.camber * yc * yc
            sy = sy - 2.0 * self.camber * yc * (np.abs(y) < self.camber_half)
        return dz, sx, sy

    def _detail_scalar(self, x: float, y: float) -> tuple[float, float, float]:
        # scene building asks for single heights hundreds of times: plain floats are ~50x cheaper
        dz = sx = sy = 0.0
        for a, k, ph in zip(self.rough_amp.tolist(), self.rough_k.tolist(), self.rough_phase.tolist()):
            arg = k[0] * x + k[1] * y + ph
            dz += a * math.sin(arg)
            c = a * math.cos(arg)
            sx += c * k[0]
            sy += c * k[1]
        if self.camber > 0:
            yc = min(max(y, -self.camber_half), self.camber_half)
            dz -= self.camber * yc * yc
            if abs(y) < self.camber_half:
                sy -= 2.0 * self.camber * yc
        return dz, sx, sy

    def height(self, x, y):
        return self.plane(x, y) + self.detail(x, y)[0]

    def tilt(self) -> np.ndarray:
        """Rotation whose z axis is the plane normal and x axis lies along world x (roads run along x)."""
        xa = np.array([1.0, 0.0, self.gx])
        xa /= np.linalg.norm(xa)
        n = np.array([-self.gx, -self.gy, 1.0])
        n /= np.linalg.norm(n)
        ya = np.cross(n, xa)
        ya /= np.linalg.norm(ya)
        xa = np.cross(ya, n)
        return np.stack([xa, ya, n], axis=1)

    def intersect(self, o: np.ndarray, d: np.ndarray, rng: np.random.Generator | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Ray parameter of the first ground hit (inf if none) and the unit normal there."""
        n = len(d)
        t = np.full(n, np.inf)
        normal = np.zeros((n, 3))
        normal[:, 2] = 1.0
        denom = d[:, 2] - self.gx * d[:, 0] - self.gy * d[:, 1]
        down = np.nonzero(denom < -1e-9)[0]
        if not len(down):
            return t, normal
        od, dd, den = o[down], d[down], denom[down]
        tg = (self.gx * od[:, 0] + self.gy * od[:, 1] - od[:, 2]) / den
        # Newton steps from the plane hit onto the detailed surface (cm-scale, gentle slopes)
        for _ in range(2):
            x = od[:, 0] + tg * dd[:, 0]
            y = od[:, 1] + tg * dd[:, 1]
            dz, sx, sy = self.detail(x, y)
            gx = self.gx + sx
            gy = self.gy + sy
            err = od[:, 2] + tg * dd[:, 2] - (self.gx * x + self.gy * y + dz)
            rate = dd[:, 2] - gx * dd[:, 0] - gy * dd[:, 1]
            rate = np.where(rate < -1e-6, rate, den)
            tg = tg - err / rate
        if self.noise_sigma > 0 and rng is not None:
            # grain (gravel, cracks): a few mm of height noise, seen along the ray at grazing incidence
            tg = tg + rng.normal(0.0, self.noise_sigma, len(tg)) / np.maximum(-rate, 0.05)
        tg = np.where(tg > 0, tg, np.inf)
        t[down] = tg
        nrm = np.stack([-gx, -gy, np.ones_like(gx)], 1)
        normal[down] = nrm / np.sqrt((nrm * nrm).sum(1))[:, None]
        return t, normal

    def reflectance(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        rho = np.full(x.shape, self.reflect_base)
        # worn asphalt patches: smooth low-frequency variation
        rho = rho * (1.0 + 0.25 * np.sin(0.31 * x + 1.7) * np.sin(0.23 * y + 0.4))
        if len(self.marking_y):
            dist = np.min(np.abs(y[:, None] - self.marking_y[None, :]), axis=1)
            dashed = np.sin(2 * np.pi * x / 9.0) > -0.3
            rho = np.where((dist < self.marking_half_width) & dashed, self.marking_reflect, rho)
        return rho


# ------------------------------------------------------------------------------------- ray casting
@dataclass
class Hits:
    t: np.ndarray  # (N,) range along the unit ray, inf for none
    prim: np.ndarray  # (N,) primitive index, -1 ground, -2 nothing
    normal: np.ndarray  # (N,3) unit surface normal (world)
    t_second: np.ndarray  # (N,) next surface behind the first one (for mixed edge returns), inf if none
    edge: np.ndarray  # (N,) angular distance of the first hit to its primitive's silhouette (rad)


def _angular_windows(prims: Primitives, o_ref: np.ndarray, heading: float, pad: float):
    """Azimuth (relative to heading) and elevation window of every primitive seen from o_ref (rad)."""
    ext = prims.world_half_extents() + pad
    rel = prims.center - o_ref
    # footprint corners
    sx = np.array([-1, -1, 1, 1], dtype=np.float64)
    sy = np.array([-1, 1, -1, 1], dtype=np.float64)
    cx = rel[:, 0:1] + sx * ext[:, 0:1]
    cy = rel[:, 1:2] + sy * ext[:, 1:2]
    az_c = np.arctan2(rel[:, 1], rel[:, 0]) - heading
    az_corner = np.arctan2(cy, cx) - heading
    delta = np.angle(np.exp(1j * (az_corner - az_c[:, None])))
    az_c = np.angle(np.exp(1j * az_c))
    az0 = az_c + delta.min(1)
    az1 = az_c + delta.max(1)
    dx_out = np.maximum(np.abs(rel[:, 0]) - ext[:, 0], 0.0)
    dy_out = np.maximum(np.abs(rel[:, 1]) - ext[:, 1], 0.0)
    inside = (dx_out == 0) & (dy_out == 0)
    az0 = np.where(inside, -np.pi, az0)
    az1 = np.where(inside, np.pi, az1)
    dh_min = np.hypot(dx_out, dy_out)
    dh_max = np.hypot(np.abs(rel[:, 0]) + ext[:, 0], np.abs(rel[:, 1]) + ext[:, 1])
    zlo = rel[:, 2] - ext[:, 2]
    zhi = rel[:, 2] + ext[:, 2]
    el1 = np.arctan2(zhi, np.where(zhi > 0, dh_min, dh_max))
    el0 = np.arctan2(zlo, np.where(zlo < 0, dh_min, dh_max))
    return az0, az1, el0, el1, dh_min


def candidate_pairs(ray_az: np.ndarray, ray_el: np.ndarray, az0, az1, el0, el1, bin_rad: float = np.radians(1.0)):
    """(ray index, primitive index) pairs whose ray falls in the primitive's angular window."""
    el_base = ray_el.min()
    ray_bin = np.floor((ray_el - el_base) / bin_rad)
    n_bins = int(ray_bin.max()) + 1 if len(ray_bin) else 0
    key = ray_bin * 8.0 + (ray_az + np.pi)  # az + pi in [0, 2pi) < 8 keeps bins apart
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    b0 = np.clip(np.floor((el0 - el_base) / bin_rad), 0, n_bins).astype(np.int64)
    b1 = np.clip(np.floor((el1 - el_base) / bin_rad), -1, n_bins - 1).astype(np.int64)
    nb = np.maximum(b1 - b0 + 1, 0)
    prim_rep = np.repeat(np.arange(len(nb)), nb)
    start = np.cumsum(nb) - nb
    bins = b0[prim_rep] + (np.arange(prim_rep.size) - np.repeat(start, nb))
    a0 = np.clip(az0[prim_rep], -np.pi, np.pi) + np.pi
    a1 = np.clip(az1[prim_rep], -np.pi, np.pi) + np.pi
    lo = np.searchsorted(key_sorted, bins * 8.0 + a0, side="left")
    hi = np.searchsorted(key_sorted, bins * 8.0 + a1, side="right")
    counts = np.maximum(hi - lo, 0)
    pair_prim = np.repeat(prim_rep, counts)
    cstart = np.cumsum(counts) - counts
    pos = np.repeat(lo, counts) + (np.arange(pair_prim.size) - np.repeat(cstart, counts))
    return order[pos], pair_prim


def _safe_inv(v: np.ndarray) -> np.ndarray:
    return 1.0 / np.where(np.abs(v) < 1e-12, np.where(v < 0, -1e-12, 1e-12), v)


def _slab(o: np.ndarray, d: np.ndarray):
    inv = _safe_inv(d)
    ta = (-1.0 - o) * inv
    tb = (1.0 - o) * inv
    return np.minimum(ta, tb), np.maximum(ta, tb)


def _quadratic(a, b, c):
    """Roots of a t^2 + 2 b t + c = 0 (entry, exit); (inf, -inf) when the ray misses."""
    disc = b * b - a * c
    ok = (disc >= 0) & (a > 1e-18)
    sq = np.sqrt(np.where(ok, disc, 0.0))
    a_safe = np.where(ok, a, 1.0)
    return np.where(ok, (-b - sq) / a_safe, np.inf), np.where(ok, (-b + sq) / a_safe, -np.inf)


def _pair_intervals(ox, oy, oz, dx, dy, dz, kind):
    """Entry/exit ray parameters of (ray, unit shape) pairs, computed column-wise for all kinds at once
    (a few dozen element-wise passes; cheaper than splitting the pairs by kind)."""
    xmin, xmax = _slab(ox, dx)
    ymin, ymax = _slab(oy, dy)
    zmin, zmax = _slab(oz, dz)
    box_in = np.maximum(np.maximum(xmin, ymin), zmin)
    box_out = np.minimum(np.minimum(xmax, ymax), zmax)
    t_in = box_in.copy()
    t_out = box_out.copy()
    for k_id in (CYLINDER, RBOX, ELLIPSOID):
        idx = np.nonzero(kind == k_id)[0]
        if not len(idx):
            continue
        x, y, z, u, v, w = ox[idx], oy[idx], oz[idx], dx[idx], dy[idx], dz[idx]
        a_xy = u * u + v * v
        b_xy = x * u + y * v
        c_xy = x * x + y * y
        if k_id == ELLIPSOID:
            ti, to = _quadratic(a_xy + w * w, b_xy + z * w, c_xy + z * z - 1.0)
        else:
            r2 = 1.0 if k_id == CYLINDER else RBOX_ROUND * RBOX_ROUND
            ti, to = _quadratic(a_xy, b_xy, c_xy - r2)
            # parallel to the axis: inside the disc for all t, or never
            inside_par = (a_xy <= 1e-18) & (c_xy <= r2)
            ti = np.where(inside_par, -np.inf, ti)
            to = np.where(inside_par, np.inf, to)
            if k_id == CYLINDER:
                ti = np.maximum(ti, zmin[idx])
                to = np.minimum(to, zmax[idx])
            else:
                ti = np.maximum(ti, box_in[idx])
                to = np.minimum(to, box_out[idx])
        t_in[idx] = ti
        t_out[idx] = to
    return t_in, t_out


def _entry_normal_and_edge(ox, oy, oz, dx, dy, dz, kind, t):
    """Entry normal (unit-shape coords, not normalised) and the entry point's distance to the silhouette
    (unit-shape coords) for first hits only."""
    px, py, pz = ox + t * dx, oy + t * dy, oz + t * dz
    xmin, _ = _slab(ox, dx)
    ymin, _ = _slab(oy, dy)
    zmin, _ = _slab(oz, dz)
    # box: the entry face is the slab entered last
    fx = (xmin >= ymin) & (xmin >= zmin)
    fy = ~fx & (ymin >= zmin)
    fz = ~fx & ~fy
    nx = np.where(fx, -np.sign(dx), 0.0)
    ny = np.where(fy, -np.sign(dy), 0.0)
    nz = np.where(fz, -np.sign(dz), 0.0)
    ax, ay, az = 1 - np.abs(px), 1 - np.abs(py), 1 - np.abs(pz)
    box_edge = np.where(fx, np.minimum(ay, az), np.where(fy, np.minimum(ax, az), np.minimum(ax, ay)))
    # cylinder side (or RBOX rounded corner): radial normal
    a_xy = np.maximum(dx * dx + dy * dy, 1e-18)
    perp = np.abs(ox * dy - oy * dx) / np.sqrt(a_xy)
    side_cyl = (kind == CYLINDER) & ~(fz & (zmin >= t - 1e-9))
    side_rb = (kind == RBOX) & (px * px + py * py > (RBOX_ROUND - 1e-6) ** 2)
    radial = side_cyl | side_rb
    nx = np.where(radial, px, nx)
    ny = np.where(radial, py, ny)
    nz = np.where(radial, 0.0, nz)
    cyl_edge = np.minimum(1.0 - perp, 1.0 - np.abs(pz))
    ell = kind == ELLIPSOID
    nx = np.where(ell, px, nx)
    ny = np.where(ell, py, ny)
    nz = np.where(ell, pz, nz)
    a = np.maximum(a_xy + dz * dz, 1e-18)
    b = ox * dx + oy * dy + oz * dz
    closest = np.sqrt(np.maximum(ox * ox + oy * oy + oz * oz - b * b / a, 0.0))
    edge = np.where(ell, 1.0 - closest, np.where(kind == CYLINDER, cyl_edge, box_edge))
    # nz for cylinder caps: the box logic above already set the z face when the cap is entered
    return nx, ny, nz, edge


MAX_ORIGIN_SPREAD = 0.3  # m: rays are cast in chunks whose origins stay this close (ego motion)


def cast_rays(o: np.ndarray, d: np.ndarray, prims: Primitives, ground: Ground | None, rng: np.random.Generator,
              *, heading: float = 0.0, max_dist: float = 600.0, ray_time: np.ndarray | None = None,
              prim_velocity: np.ndarray | None = None) -> Hits:
    """First accepted hit of every ray (origins o (N,3), unit directions d (N,3), world frame).

    Semi-transparent surfaces (glass, spokes, foliage) accept a crossing ray with their hit probability,
    so a ray may pass a window and return from the seat behind it. Rays are expected in time order:
    when their origins move (ego motion) they are cast in chunks of nearby origins, which keeps the
    angular windows of nearby primitives tight.

    Moving primitives: with ``prim_velocity`` (P,3) world m/s and ``ray_time`` (N,) s, a ray sees each
    primitive translated by velocity x ray time (the primitives are given at time 0). Casting is then
    chunked by the largest relative motion too; without any moving primitive the cast is unchanged.
    """
    n = len(d)
    if prim_velocity is not None and len(prims) and n and np.any(prim_velocity != 0):
        if ray_time is None or len(ray_time) != n or prim_velocity.shape != (len(prims), 3):
            raise ValueError("moving primitives need ray_time (N,) and prim_velocity (P,3)")
        obj = _cast_moving(o, d, prims, rng, heading, max_dist, np.asarray(ray_time, np.float64),
                           np.asarray(prim_velocity, np.float64))
    elif n and len(prims):
        travel = np.sqrt(((o[1:] - o[:-1]) ** 2).sum(1)).cumsum() if n > 1 else np.zeros(0)
        total = float(travel[-1]) if len(travel) else 0.0
        if total > 2 * MAX_ORIGIN_SPREAD:
            n_chunks = int(np.ceil(total / (2 * MAX_ORIGIN_SPREAD)))
            bounds = np.searchsorted(np.r_[0.0, travel], np.linspace(0, total, n_chunks + 1)[1:-1])
            parts = [_cast_prims(o[a:b_], d[a:b_], prims, rng, heading, max_dist)
                     for a, b_ in zip(np.r_[0, bounds], np.r_[bounds, n]) if b_ > a]
            obj = tuple(np.concatenate([p[i] for p in parts]) for i in range(5))
        else:
            obj = _cast_prims(o, d, prims, rng, heading, max_dist)
    else:
        obj = (np.full(n, np.inf), np.full(n, -2, dtype=np.int64), np.zeros((n, 3)), np.full(n, np.inf),
               np.full(n, np.inf))
    best_t, best_p, best_n, second_t, edge = obj
    if ground is not None:
        tg, ng = ground.intersect(o, d, rng)
        closer = tg < best_t
        second_t = np.where(closer, best_t, np.minimum(second_t, tg))
        best_t = np.where(closer, tg, best_t)
        best_p = np.where(closer, -1, best_p)
        best_n = np.where(closer[:, None], ng, best_n)
        edge = np.where(closer, np.inf, edge)
    return Hits(best_t, best_p, best_n, second_t, edge)


def _cast_moving(o, d, prims: Primitives, rng, heading: float, max_dist: float, tau: np.ndarray, vel: np.ndarray):
    """Cast against primitives that move with ``vel`` during the rays' times ``tau``: in chunks whose
    origin travel plus the fastest primitive's travel stays within 2 x MAX_ORIGIN_SPREAD."""
    n = len(d)
    travel = np.r_[0.0, np.sqrt(((o[1:] - o[:-1]) ** 2).sum(1)).cumsum()]
    v_max = float(np.sqrt((vel ** 2).sum(1)).max())
    motion = travel + v_max * np.abs(tau - tau[0])
    total = float(motion.max())
    n_chunks = max(1, int(np.ceil(total / (2 * MAX_ORIGIN_SPREAD))))
    if n_chunks == 1:
        return _cast_prims(o, d, prims, rng, heading, max_dist, tau, vel)
    bounds = np.searchsorted(motion, np.linspace(0, total, n_chunks + 1)[1:-1])
    parts = [_cast_prims(o[a:b_], d[a:b_], prims, rng, heading, max_dist, tau[a:b_], vel)
             for a, b_ in zip(np.r_[0, bounds], np.r_[bounds, n]) if b_ > a]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(5))


def _cast_prims(o: np.ndarray, d: np.ndarray, prims: Primitives, rng: np.random.Generator, heading: float,
                max_dist: float, tau: np.ndarray | None = None, vel: np.ndarray | None = None):
    """First accepted primitive hit per ray: (t, primitive, normal, next surface t, edge distance).

    With ``tau``/``vel`` each primitive is at ``center + vel * tau`` for each ray: the primitives are
    placed at the chunk's mean time and every (ray, primitive) pair's origin is shifted by the remaining
    relative motion (the angular windows are padded by each primitive's travel within the chunk)."""
    n = len(d)
    o_ref = o.mean(0) if n else np.zeros(3)
    dv = o - o_ref
    pad = float(np.sqrt(np.max(dv[:, 0] ** 2 + dv[:, 1] ** 2 + dv[:, 2] ** 2))) if n else 0.0
    moving = pad > 0
    prim_moves = vel is not None and n > 0
    if prim_moves:
        tau_ref = float(tau.mean())
        dtau = tau - tau_ref
        prims = Primitives(*[getattr(prims, f) for f in _FIELDS])
        prims.center = prims.center + vel * tau_ref
        speed = np.sqrt((vel ** 2).sum(1))
        pad = pad + (speed * float(np.abs(dtau).max()))[:, None]
        moving = True
    best_t = np.full(n, np.inf)
    best_p = np.full(n, -2, dtype=np.int64)
    best_n = np.zeros((n, 3))
    second_t = np.full(n, np.inf)
    edge = np.full(n, np.inf)

    if len(prims) and n:
        az0, az1, el0, el1, dmin = _angular_windows(prims, o_ref, heading, pad)
        sel = np.nonzero(dmin < max_dist)[0]
        ray_az = np.arctan2(d[:, 1], d[:, 0]) - heading
        ray_az = (ray_az + np.pi) % (2 * np.pi) - np.pi
        ray_el = np.arcsin(np.clip(d[:, 2], -1, 1))
        ray_i, pk = candidate_pairs(ray_az, ray_el, az0[sel], az1[sel], el0[sel], el1[sel])
        prim_i = sel[pk]
        if len(ray_i):
            # per primitive: world -> unit-shape map M = R^T / half, and the reference origin mapped
            M = np.swapaxes(prims.rot, 1, 2) / prims.half[:, :, None]
            q = np.einsum("pij,pj->pi", M, o_ref - prims.center)
            Mp = [M[:, i, j][prim_i] for i in range(3) for j in range(3)]
            dxr, dyr, dzr = d[ray_i, 0], d[ray_i, 1], d[ray_i, 2]
            dsx = Mp[0] * dxr + Mp[1] * dyr + Mp[2] * dzr
            dsy = Mp[3] * dxr + Mp[4] * dyr + Mp[5] * dzr
            dsz = Mp[6] * dxr + Mp[7] * dyr + Mp[8] * dzr
            osx, osy, osz = q[prim_i, 0], q[prim_i, 1], q[prim_i, 2]
            if moving:
                vx, vy, vz = dv[ray_i, 0], dv[ray_i, 1], dv[ray_i, 2]
                if prim_moves:  # origin relative to the primitive, which has moved on by vel * dtau
                    dt_pair = dtau[ray_i]
                    vp = vel[prim_i]
                    vx = vx - vp[:, 0] * dt_pair
                    vy = vy - vp[:, 1] * dt_pair
                    vz = vz - vp[:, 2] * dt_pair
                osx = osx + Mp[0] * vx + Mp[1] * vy + Mp[2] * vz
                osy = osy + Mp[3] * vx + Mp[4] * vy + Mp[5] * vz
                osz = osz + Mp[6] * vx + Mp[7] * vy + Mp[8] * vz
            kind = prims.kind[prim_i]
            t_in, t_out = _pair_intervals(osx, osy, osz, dsx, dsy, dsz, kind)
            hit = (t_in <= t_out) & (t_in > 0)
            # accept: solid surfaces by hit probability; volumes (foliage) by path length inside
            k = prims.volume_k[prim_i]
            path = np.maximum(t_out - t_in, 0.0)
            p_acc = np.where(k > 0, -np.expm1(-k * path), 1.0) * prims.hit_prob[prim_i]
            hit &= rng.random(len(ray_i)) < p_acc
            hi = np.nonzero(hit)[0]
            t_hit = t_in[hi]
            vol = k[hi] > 0
            if vol.any():
                # depth of the returning leaf: exponential, truncated to the path inside
                u = rng.random(int(vol.sum()))
                kv, lv = k[hi][vol], path[hi][vol]
                t_hit[vol] = t_hit[vol] - np.log1p(-u * -np.expm1(-kv * lv)) / kv
            rh = ray_i[hi]
            np.minimum.at(best_t, rh, t_hit)
            is_first = t_hit == best_t[rh]
            # one winner per ray even on exact ties
            fsel = hi[is_first]
            rf = ray_i[fsel]
            winner = np.full(n, -1, np.int64)
            winner[rf] = fsel
            fsel = winner[winner >= 0]
            rf = ray_i[fsel]
            # the next surface along the ray (for mixed returns at silhouettes)
            rest = ~np.isin(hi, fsel)
            np.minimum.at(second_t, rh[rest], t_hit[rest])
            best_p[rf] = prim_i[fsel]
            nx, ny, nz, e = _entry_normal_and_edge(osx[fsel], osy[fsel], osz[fsel], dsx[fsel], dsy[fsel], dsz[fsel],
                                                    kind[fsel], t_in[fsel])
            pf = prim_i[fsel]
            half = prims.half[pf]
            nl = np.stack([nx / half[:, 0], ny / half[:, 1], nz / half[:, 2]], 1)
            nw = np.einsum("pij,pj->pi", prims.rot[pf], nl)
            fvol = prims.volume_k[pf] > 0
            if fvol.any():  # leaves face every way
                nw[fvol] = rng.normal(size=(int(fvol.sum()), 3))
            nw /= np.maximum(np.sqrt(nw[:, 0] ** 2 + nw[:, 1] ** 2 + nw[:, 2] ** 2), 1e-12)[:, None]
            best_n[rf] = nw
            # angular distance to the silhouette: unit-shape margin x smallest half extent / range
            hmin = np.minimum(np.minimum(half[:, 0], half[:, 1]), half[:, 2])
            edge[rf] = np.where(fvol, np.inf, np.clip(e, 0, None) * hmin / np.maximum(best_t[rf], 1e-3))

    return best_t, best_p, best_n, second_t, edge
