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
        r["center"].append(np.asarray(center, dtype=np.float64))
        r["rot"].append(np.eye(3) if rot is None else np.asarray(rot, dtype=np.float64))
        r["half"].append(np.maximum(np.asarray(half, dtype=np.float64), 1e-3))
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
            np.stack(r["center"]), np.stack(r["rot"]), np.stack(r["half"]), np.asarray(r["kind"], np.int8),
            np.asarray(r["reflect"], np.float64), np.asarray(r["retro"], bool),
            np.asarray(r["hit_prob"], np.float64), np.asarray(r["volume_k"], np.float64),
            np.asarray(r["instance"], np.int32),
        )


def rot_z(yaw: float | np.ndarray) -> np.ndarray:
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
    noise_sigma: float = 0.008  # per-point grain (gravel, cracks)

    def plane(self, x, y):
        return self.gx * x + self.gy * y

    def height(self, x, y):
        z = self.gx * x + self.gy * y
        for a, k, ph in zip(self.rough_amp, self.rough_k, self.rough_phase):
            z = z + a * np.sin(k[0] * x + k[1] * y + ph)
        return z

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

    def intersect(self, o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ray parameter of the first ground hit (inf if none) and the unit normal there."""
        denom = d[:, 2] - self.gx * d[:, 0] - self.gy * d[:, 1]
        num = self.gx * o[:, 0] + self.gy * o[:, 1] - o[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(denom < -1e-9, num / denom, np.inf)
        # two Newton steps onto the rough surface (roughness is cm-scale, slopes small)
        for _ in range(2):
            finite = np.isfinite(t)
            tt = np.where(finite, t, 0.0)
            p = o + tt[:, None] * d
            err = p[:, 2] - self.height(p[:, 0], p[:, 1])
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(finite, tt - err / denom, np.inf)
        t = np.where(t > 0, t, np.inf)
        # normal of the rough surface: gradient of the height field
        tt = np.where(np.isfinite(t), t, 0.0)
        p = o + tt[:, None] * d
        gx = np.full(len(t), self.gx)
        gy = np.full(len(t), self.gy)
        for a, k, ph in zip(self.rough_amp, self.rough_k, self.rough_phase):
            c = a * np.cos(k[0] * p[:, 0] + k[1] * p[:, 1] + ph)
            gx = gx + c * k[0]
            gy = gy + c * k[1]
        n = np.stack([-gx, -gy, np.ones_like(gx)], -1)
        n /= np.linalg.norm(n, axis=1, keepdims=True)
        return t, n

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
    v = np.where(np.abs(v) < 1e-12, np.where(v < 0, -1e-12, 1e-12), v)
    return 1.0 / v


def _intersect_pairs(o_s: np.ndarray, d_s: np.ndarray, kind: np.ndarray):
    """Entry/exit parameters and entry normal (unit-shape coords) of rays (o_s, d_s) vs unit shapes."""
    n = len(kind)
    t_in = np.full(n, np.inf)
    t_out = np.full(n, -np.inf)
    nrm = np.zeros((n, 3))
    edge = np.zeros(n)  # distance of the entry point to the silhouette in unit coords

    # slab test, used by BOX and RBOX, and the z-slab of CYLINDER
    inv = _safe_inv(d_s)
    ta = (-1.0 - o_s) * inv
    tb = (1.0 - o_s) * inv
    tmin = np.minimum(ta, tb)
    tmax = np.maximum(ta, tb)

    boxlike = (kind == BOX) | (kind == RBOX)
    if boxlike.any():
        idx = np.nonzero(boxlike)[0]
        tm = tmin[idx]
        axis = np.argmax(tm, axis=1)
        tin = tm[np.arange(len(idx)), axis]
        tout = tmax[idx].min(1)
        nb = np.zeros((len(idx), 3))
        nb[np.arange(len(idx)), axis] = -np.sign(d_s[idx, axis])
        p = o_s[idx] + tin[:, None] * d_s[idx]
        # distance to the nearest face edge, ignoring the entry axis
        m = 1.0 - np.abs(p)
        m[np.arange(len(idx)), axis] = np.inf
        e = m.min(1)
        rb = kind[idx] == RBOX
        if rb.any():
            j = np.nonzero(rb)[0]
            ci, co, cn = _cylinder(o_s[idx[j]], d_s[idx[j]], RBOX_ROUND)
            use_c = ci > tin[j]
            tin[j] = np.maximum(tin[j], ci)
            tout[j] = np.minimum(tout[j], co)
            nb[j] = np.where(use_c[:, None], cn, nb[j])
        t_in[idx], t_out[idx], nrm[idx], edge[idx] = tin, tout, nb, e

    cyl = kind == CYLINDER
    if cyl.any():
        idx = np.nonzero(cyl)[0]
        ci, co, cn = _cylinder(o_s[idx], d_s[idx], 1.0)
        zi, zo = tmin[idx, 2], tmax[idx, 2]
        cap = zi > ci
        tin = np.maximum(ci, zi)
        tout = np.minimum(co, zo)
        nz = np.zeros_like(cn)
        nz[:, 2] = -np.sign(d_s[idx, 2])
        nb = np.where(cap[:, None], nz, cn)
        p = o_s[idx] + np.where(np.isfinite(tin), tin, 0.0)[:, None] * d_s[idx]
        # silhouette distance: perpendicular offset of the ray from the axis vs radius, and the caps
        dxy = d_s[idx, :2]
        a = np.maximum((dxy * dxy).sum(1), 1e-12)
        perp = np.abs(o_s[idx, 0] * dxy[:, 1] - o_s[idx, 1] * dxy[:, 0]) / np.sqrt(a)
        e = np.minimum(1.0 - perp, 1.0 - np.abs(p[:, 2]))
        t_in[idx], t_out[idx], nrm[idx], edge[idx] = tin, tout, nb, e

    ell = kind == ELLIPSOID
    if ell.any():
        idx = np.nonzero(ell)[0]
        o, d = o_s[idx], d_s[idx]
        a = (d * d).sum(1)
        b = (o * d).sum(1)
        c = (o * o).sum(1) - 1.0
        disc = b * b - a * c
        ok = disc >= 0
        sq = np.sqrt(np.where(ok, disc, 0.0))
        tin = np.where(ok, (-b - sq) / a, np.inf)
        tout = np.where(ok, (-b + sq) / a, -np.inf)
        p = o + np.where(ok, tin, 0.0)[:, None] * d
        # closest approach of the ray to the centre vs radius 1
        closest = np.sqrt(np.maximum(c + 1.0 - b * b / a, 0.0))
        t_in[idx], t_out[idx], nrm[idx], edge[idx] = tin, tout, p, 1.0 - closest
    return t_in, t_out, nrm, edge


def _cylinder(o: np.ndarray, d: np.ndarray, radius: float):
    """Infinite cylinder x^2 + y^2 <= radius^2 along z: entry, exit, entry normal."""
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    b = o[:, 0] * d[:, 0] + o[:, 1] * d[:, 1]
    c = o[:, 0] ** 2 + o[:, 1] ** 2 - radius * radius
    parallel = a < 1e-12
    disc = b * b - a * c
    ok = (disc >= 0) & ~parallel
    sq = np.sqrt(np.where(ok, disc, 0.0))
    a_safe = np.where(parallel, 1.0, a)
    tin = np.where(ok, (-b - sq) / a_safe, np.where(parallel & (c <= 0), -np.inf, np.inf))
    tout = np.where(ok, (-b + sq) / a_safe, np.where(parallel & (c <= 0), np.inf, -np.inf))
    p = o + np.where(np.isfinite(tin), tin, 0.0)[:, None] * d
    n = np.stack([p[:, 0], p[:, 1], np.zeros(len(p))], -1)
    return tin, tout, n


def cast_rays(o: np.ndarray, d: np.ndarray, prims: Primitives, ground: Ground | None, rng: np.random.Generator,
              *, heading: float = 0.0, max_dist: float = 600.0) -> Hits:
    """First accepted hit of every ray (origins o (N,3), unit directions d (N,3), world frame).

    Semi-transparent surfaces (glass, spokes, foliage) accept a crossing ray with their hit probability,
    so a ray may pass a window and return from the seat behind it.
    """
    n = len(d)
    o_ref = o.mean(0)
    pad = float(np.max(np.linalg.norm(o - o_ref, axis=1))) if n else 0.0
    best_t = np.full(n, np.inf)
    best_p = np.full(n, -2, dtype=np.int64)
    best_n = np.zeros((n, 3))
    second_t = np.full(n, np.inf)
    edge = np.full(n, np.inf)

    if len(prims):
        az0, az1, el0, el1, dmin = _angular_windows(prims, o_ref, heading, pad)
        keep = dmin < max_dist
        sel = np.nonzero(keep)[0]
        ray_az = np.angle(np.exp(1j * (np.arctan2(d[:, 1], d[:, 0]) - heading)))
        ray_el = np.arcsin(np.clip(d[:, 2], -1, 1))
        ray_i, pk = candidate_pairs(ray_az, ray_el, az0[sel], az1[sel], el0[sel], el1[sel])
        prim_i = sel[pk]
        if len(ray_i):
            rot = prims.rot[prim_i]
            half = prims.half[prim_i]
            rel = o[ray_i] - prims.center[prim_i]
            o_s = np.einsum("pji,pj->pi", rot, rel) / half
            d_s = np.einsum("pji,pj->pi", rot, d[ray_i]) / half
            t_in, t_out, nrm_s, edge_s = _intersect_pairs(o_s, d_s, prims.kind[prim_i])
            hit = (t_in <= t_out) & (t_out > 0) & (t_in > 0)
            ray_i, prim_i, t_in, t_out = ray_i[hit], prim_i[hit], t_in[hit], t_out[hit]
            nrm_s, edge_s, half, rot = nrm_s[hit], edge_s[hit], half[hit], rot[hit]
            # volumes (foliage): return probability grows with the path length inside
            k = prims.volume_k[prim_i]
            vol = k > 0
            path = t_out - t_in
            p_acc = np.where(vol, 1.0 - np.exp(-k * path), 1.0) * prims.hit_prob[prim_i]
            accept = rng.random(len(ray_i)) < p_acc
            t_hit = t_in.copy()
            if vol.any():
                # depth of the leaf that returned: exponential, truncated to the path inside
                u = rng.random(int(vol.sum()))
                kv, lv = k[vol], path[vol]
                depth = -np.log1p(-u * (1.0 - np.exp(-kv * lv))) / kv
                t_hit[vol] = t_in[vol] + depth
            ray_i, prim_i, t_hit = ray_i[accept], prim_i[accept], t_hit[accept]
            nrm_s, edge_s, half, rot, vol = nrm_s[accept], edge_s[accept], half[accept], rot[accept], vol[accept]
            if len(ray_i):
                order = np.lexsort((t_hit, ray_i))
                rs = ray_i[order]
                first = np.ones(len(rs), bool)
                first[1:] = rs[1:] != rs[:-1]
                fi = order[first]
                r = ray_i[fi]
                best_t[r] = t_hit[fi]
                best_p[r] = prim_i[fi]
                nl = nrm_s[fi] / half[fi]
                nw = np.einsum("pij,pj->pi", rot[fi], nl)
                nw /= np.maximum(np.linalg.norm(nw, axis=1, keepdims=True), 1e-12)
                # foliage: leaves face every way
                if vol[fi].any():
                    vv = np.nonzero(vol[fi])[0]
                    rnd = rng.normal(size=(len(vv), 3))
                    nw[vv] = rnd / np.linalg.norm(rnd, axis=1, keepdims=True)
                best_n[r] = nw
                # angular distance to the silhouette: unit-coordinate margin times the smallest half
                # extent, over the range
                edge[r] = np.clip(edge_s[fi], 0, None) * half[fi].min(1) / np.maximum(t_hit[fi], 1e-3)
                # the next surface along the ray (another primitive) for mixed returns at edges
                sec = np.zeros(len(rs), bool)
                sec[1:] = (~first[1:]) & first[:-1]
                si = order[sec]
                second_t[ray_i[si]] = t_hit[si]

    if ground is not None:
        tg, ng = ground.intersect(o, d)
        closer = tg < best_t
        second_t = np.where(closer, best_t, np.minimum(second_t, tg))
        best_t = np.where(closer, tg, best_t)
        best_p = np.where(closer, -1, best_p)
        best_n = np.where(closer[:, None], ng, best_n)
        edge = np.where(closer, np.inf, edge)
    return Hits(best_t, best_p, best_n, second_t, edge)
