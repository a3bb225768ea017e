"""Frame simulation: scan pattern -> ray casting -> Livox-like returns + ground-truth boxes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError
from livox_infer.sim.geometry import cast_rays, rot_x, rot_y, rot_z
from livox_infer.sim.scene import LABEL_MARGIN, Scene, make_scene
from livox_infer.sim.sensors import SensorModel, get_sensor

# Livox tag bits 0-1: spatial-position noise confidence (0 normal, 1 high-confidence noise, 2 moderate)
TAG_NORMAL, TAG_NOISE_HIGH, TAG_NOISE_MODERATE = 0, 1, 2

SCENE_OPTIONS = ("n_cars", "n_pedestrians", "n_cyclists", "clutter", "length", "moving", "ego_speed_scene",
                 "lookalikes", "ped_groups", "large_vehicles", "ped_context", "ped_by_cars",
                 "ped_overhead", "shrubs")
FRAME_OPTIONS = (
    "sensor_height", "pitch_deg", "roll_deg", "yaw_deg", "period", "ego_speed", "range_noise", "dropout",
    "mixed_edges", "false_alarm_rate", "max_box_range", "yaw_rate_dps", "deskew",
)


@dataclass
class SimFrame:
    """One simulated frame (REP-103 sensor frame). Raw points: sensor frame at each shot time; boxes: where
    each object appears (see docs/simulator.md, "Time convention"); deskewed: both at the frame start."""

    points: np.ndarray  # (N,4) f32 x y z reflectivity; (0,0,0,0) rows are no-returns
    time: np.ndarray  # (N,) f64 seconds from frame start
    tag: np.ndarray  # (N,) u8 Livox tag
    line: np.ndarray  # (N,) u8 laser index
    boxes: np.ndarray  # (M,7) f32 x y z l w h yaw
    labels: np.ndarray  # (M,) i64 index into CLASS_NAMES
    num_points: np.ndarray  # (M,) i64 returns on each object
    sensor_height: float  # metres above the ground under the sensor
    sensor: str
    instance: np.ndarray  # (N,) i32 index into boxes of the object each point hit, -1 otherwise
    object_ids: np.ndarray  # (M,) i64 ids stable across the frames of a drive
    velocities: np.ndarray  # (M,2) f32 object velocity in the sensor frame (x, y), m/s
    frame_index: int
    stamp: float  # seconds, scene time of the frame start
    pose: np.ndarray  # (4,4) world-from-sensor at the frame start

    @property
    def valid(self) -> np.ndarray:
        """Mask of real returns (rows that are not (0,0,0))."""
        return np.any(self.points[:, :3] != 0, axis=1)


def _split_options(options: dict) -> tuple[dict, dict]:
    scene_kw, frame_kw = {}, {}
    for k, v in options.items():
        if k in SCENE_OPTIONS:
            scene_kw["ego_speed" if k == "ego_speed_scene" else k] = v
        elif k in FRAME_OPTIONS:
            frame_kw[k] = v
        else:
            raise ConfigError(f"unknown simulate option {k!r}; scene: {SCENE_OPTIONS}, frame: {FRAME_OPTIONS}")
    return scene_kw, frame_kw


def _resolve_scene(scene, seed: int, scene_kw: dict) -> Scene:
    if scene is None:
        scene = "street"
    if isinstance(scene, str):
        return make_scene(seed, scene, **scene_kw)
    if isinstance(scene, Scene):
        if scene_kw:
            raise ConfigError(f"scene options {sorted(scene_kw)} only apply when the scene is built here")
        return scene
    raise ConfigError(f"scene must be a Scene, 'street', 'open' or None, not {type(scene).__name__}")


def _mount(seed: int, sensor_height, pitch_deg, roll_deg, yaw_deg) -> tuple[float, float, float, float]:
    """Mounting height and attitude: one draw per seed (shared by all frames of a drive)."""
    rng = np.random.default_rng([int(seed), 3])
    if sensor_height is None:
        h = float(rng.uniform(0.5, 2.5))
    elif isinstance(sensor_height, (tuple, list)):  # a range, drawn once per seed like the default
        if len(sensor_height) != 2 or not (0.05 <= float(sensor_height[0]) <= float(sensor_height[1]) <= 10.0):
            raise ConfigError(f"sensor_height range must be (low, high) within 0.05..10, got {sensor_height!r}")
        h = float(rng.uniform(float(sensor_height[0]), float(sensor_height[1])))
    else:
        h = float(sensor_height)
    p = float(rng.uniform(-3, 3)) if pitch_deg is None else float(pitch_deg)
    r = float(rng.uniform(-3, 3)) if roll_deg is None else float(roll_deg)
    y = float(rng.uniform(-3, 3)) if yaw_deg is None else float(yaw_deg)
    if not (0.05 <= h <= 10.0):
        raise ConfigError(f"sensor_height {h} m out of range 0.05..10")
    if max(abs(p), abs(r)) > 45:
        raise ConfigError("pitch/roll beyond 45 deg are not supported")
    return h, p, r, y


def _draw_range(seed: int, value, name: str, lo: float, hi: float, salt: int) -> float:
    """A value, or a (low, high) range drawn from once per seed (like the mount)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or not (lo <= float(value[0]) <= float(value[1]) <= hi):
            raise ConfigError(f"{name} range must be (low, high) with {lo} <= low <= high <= {hi}, got {value!r}")
        return float(np.random.default_rng([int(seed), salt]).uniform(float(value[0]), float(value[1])))
    v = float(value)
    if not (lo <= v <= hi):
        raise ConfigError(f"{name} {v} out of range {lo}..{hi}")
    return v


def _draw_speed(seed: int, value) -> float:
    return _draw_range(seed, value, "ego_speed", 0.0, 70.0, salt=4)


def simulate_frame(sensor: str | SensorModel = "avia", seed: int = 0, frame_index: int = 0,
                   scene: Scene | str | None = None, **options) -> SimFrame:
    """Simulate one frame of ``sensor`` in ``scene`` (a Scene, or "street"/"open" built from ``seed``).

    Scene options (when the scene is built here): n_cars, n_pedestrians, n_cyclists, clutter, length, moving,
    lookalikes, ped_groups, large_vehicles, ped_context, ped_by_cars, ped_overhead, shrubs (make_scene).
    Frame options: sensor_height (m, or a (low, high) range; default U(0.5, 2.5) per seed), pitch_deg / roll_deg / yaw_deg
    (default U(-3, 3) per seed), period (s, 0.1), ego_speed (m/s along the road, or a (low, high) range
    drawn per seed; 0), yaw_rate_dps (vehicle turn rate, deg/s, or a range; 0), deskew (False: points in the
    sensor frame at their own shot time, as the driver publishes them; True: motion-compensated into the
    sensor frame at the frame start), range_noise (m,
    sensor default 0.02), dropout (0.01), mixed_edges (True), false_alarm_rate (1e-4),
    max_box_range (m, 200: objects further away get no box).
    """
    for name, v in (("seed", seed), ("frame_index", frame_index)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {v!r}")
    sensor_model = get_sensor(sensor, seed)
    scene_kw, kw = _split_options(options)
    scn = _resolve_scene(scene, seed, scene_kw)
    period = float(kw.get("period", 0.1))
    if not (0.001 <= period <= 10.0):
        raise ConfigError(f"period {period} s out of range 0.001..10")
    ego_speed = _draw_speed(seed, kw.get("ego_speed", 0.0))
    yaw_rate = _draw_range(seed, kw.get("yaw_rate_dps", 0.0), "yaw_rate_dps", -120.0, 120.0, salt=5)
    deskew = bool(kw.get("deskew", False))
    range_noise = float(kw.get("range_noise", sensor_model.range_noise))
    dropout = float(kw.get("dropout", 0.01))
    false_alarm = float(kw.get("false_alarm_rate", 1e-4))
    if range_noise < 0 or not (0 <= dropout < 1) or not (0 <= false_alarm < 1):
        raise ConfigError("range_noise must be >= 0, dropout and false_alarm_rate in [0, 1)")
    mixed_edges = bool(kw.get("mixed_edges", True))
    max_box_range = float(kw.get("max_box_range", 200.0))
    h, pitch, roll, yaw_off = _mount(seed, kw.get("sensor_height"), kw.get("pitch_deg"), kw.get("roll_deg"),
                                     kw.get("yaw_deg"))
    rng = np.random.default_rng([int(seed), int(frame_index), 2])

    # ---- sensor pose (world-from-sensor); the ego drives along +x in its lane
    t0 = int(frame_index) * period
    mount_yaw = np.radians(yaw_off)
    omega = np.radians(yaw_rate)
    att = rot_y(np.radians(pitch)) @ rot_x(np.radians(roll))

    def vehicle_heading(t):
        return omega * t

    def sensor_rot(t: float) -> np.ndarray:
        # the mount attitude is relative to the road surface the vehicle stands on
        return scn.ground_tilt @ rot_z(vehicle_heading(t) + mount_yaw) @ att

    def ego_origin(t):
        # the vehicle drives along +x, on an arc when turning
        t = np.asarray(t, dtype=np.float64)
        if abs(omega) < 1e-9:
            x, y = ego_speed * t, np.zeros_like(t)
        else:
            x = ego_speed / omega * np.sin(omega * t)
            y = ego_speed / omega * (1.0 - np.cos(omega * t))
        y = y + scn.ego_y
        return np.stack([x, y, scn.ground.height(x, y) + h], -1)

    R = sensor_rot(t0)
    heading = float(vehicle_heading(t0 + period / 2) + mount_yaw)

    # ---- shots
    rel_t, line, d_s = sensor_model.shots(int(frame_index), period, seed)
    n = len(rel_t)
    sig = np.radians(sensor_model.angle_noise_deg)
    d_s = d_s + np.clip(rng.normal(0, sig, d_s.shape), -2 * sig, 2 * sig)
    d_s /= np.linalg.norm(d_s, axis=1, keepdims=True)
    if omega == 0.0:
        d_w = d_s @ R.T
    else:  # the sensor turns during the frame: rotate each shot by the heading at its time
        d_a = d_s @ att.T
        psi = vehicle_heading(t0 + rel_t) + mount_yaw
        c, s_ = np.cos(psi), np.sin(psi)
        d_r = np.stack([c * d_a[:, 0] - s_ * d_a[:, 1], s_ * d_a[:, 0] + c * d_a[:, 1], d_a[:, 2]], 1)
        d_w = d_r @ scn.ground_tilt.T
    o_w = ego_origin(t0 + rel_t)
    prims, obj_pos, obj_rot = scn.primitives_at(t0)
    # moving objects move on during the frame: each ray sees them where they are at its shot time
    obj_vel = np.array([np.r_[ob.velocity, 0.0] for ob in scn.objects]).reshape(-1, 3)
    prim_vel = None  # static scenes: the plain (unchanged) cast
    if len(prims) and np.any(obj_vel != 0):
        prim_vel = np.where((prims.instance >= 0)[:, None], obj_vel[np.maximum(prims.instance, 0)], 0.0)
    hits = cast_rays(o_w, d_w, prims, scn.ground, rng, heading=heading, ray_time=rel_t, prim_velocity=prim_vel)

    # ---- returns
    t = hits.t
    hit = np.isfinite(t)
    is_ground = hits.prim == -1
    prim_idx = np.where(hits.prim >= 0, hits.prim, 0)
    hp = o_w + np.where(hit, t, 0.0)[:, None] * d_w
    rho = np.where(is_ground, scn.ground.reflectance(hp[:, 0], hp[:, 1]), prims.reflect[prim_idx] if len(prims) else 0.0)
    retro = np.where(is_ground, False, prims.retro[prim_idx] if len(prims) else False)
    cos_inc = np.clip(np.abs(np.einsum("ij,ij->i", hits.normal, d_w)), 1e-3, 1.0)
    # detection range: weak returns at grazing incidence die first (fitted to real Horizon ground range)
    rho_range = np.where(retro, 1.0, rho * np.sqrt(cos_inc))
    r_max = sensor_model.max_range(rho_range) * rng.uniform(0.85, 1.05, n)
    ok = hit & (t <= r_max) & (t >= sensor_model.range_min) & (rng.random(n) >= dropout)
    # low-return far points drop out more often near the limit
    ok &= rng.random(n) >= np.clip((t / r_max - 0.7) / 0.3, 0, 1) * 0.5
    rng_out = np.where(hit, t, 0.0)
    tag = np.zeros(n, np.uint8)
    on_surface = ok.copy()
    if mixed_edges:
        half_div = np.radians(sensor_model.beam_divergence_deg) / 2
        gap = np.where(ok & np.isfinite(hits.t_second), hits.t_second - rng_out, 0.0)
        near_edge = ok & (hits.edge < half_div) & (gap > 0.3) & (gap < 15.0)
        p_mix = 0.6 * (1.0 - hits.edge / half_div)
        mix = near_edge & (rng.random(n) < p_mix)
        frac = rng.random(n)
        rng_out = np.where(mix, rng_out + frac * gap, rng_out)
        tag = np.where(mix, np.where((frac > 0.1) & (frac < 0.9), TAG_NOISE_HIGH, TAG_NOISE_MODERATE), tag).astype(np.uint8)
        on_surface &= ~mix
    sigma = range_noise * np.maximum(1.0, rng_out / 50.0)
    rng_out = rng_out + rng.normal(0, 1, n) * sigma
    # reflectivity: Livox reports calibrated reflectivity (0-150 diffuse, 151-255 retro-reflective)
    diffuse = 150.0 * rho * cos_inc ** 0.2 / (1.0 + (rng_out / 300.0) ** 2)
    # foliage returns come from leaves filling part of the beam: weaker than a full surface
    partial = np.where(is_ground, False, prims.volume_k[prim_idx] > 0 if len(prims) else False)
    diffuse = np.where(partial, diffuse * rng.uniform(0.25, 0.7, n), diffuse)
    diffuse = diffuse * rng.lognormal(0.0, 0.3, n) + rng.normal(0, 1.0, n)
    retro_val = 151.0 + 104.0 * np.clip(rho * (0.6 + 0.4 * cos_inc) * rng.uniform(0.8, 1.5, n), 0, 1)  # often saturates
    inten = np.where(retro, retro_val, np.clip(diffuse, 0, 150))
    # rare false alarms (sun, crosstalk): random range on otherwise empty or any ray
    fa = rng.random(n) < false_alarm
    if fa.any():
        rng_out = np.where(fa, rng.uniform(0.5, 40.0, n), rng_out)
        inten = np.where(fa, rng.uniform(0, 20, n), inten)
        tag = np.where(fa, TAG_NOISE_HIGH, tag).astype(np.uint8)
        ok |= fa
        on_surface &= ~fa
    ok &= rng_out > 0
    pts = np.zeros((n, 4), np.float32)
    o0 = ego_origin(np.array([t0]))[0]
    if deskew:  # motion-compensated output: every point in the sensor frame at the frame start
        p_w = o_w[ok] + rng_out[ok, None] * d_w[ok]
        pts[ok, :3] = ((p_w - o0) @ R).astype(np.float32)
    else:  # as the driver publishes it: each point in the sensor frame at its own shot time
        pts[ok, :3] = (rng_out[ok, None] * d_s[ok]).astype(np.float32)
    pts[ok, 3] = np.round(inten[ok]).astype(np.float32)
    tag = np.where(ok, tag, 0).astype(np.uint8)
    # (0,0,0) rows are exactly the no-returns: a kept point has a positive range
    on_surface &= ok
    inst_all = np.where(on_surface & (hits.prim >= 0), prims.instance[prim_idx] if len(prims) else -1, -1)

    # ---- ground truth: each object where it appears in this cloud. An object's returns span its scan
    # time; its box is placed at the mean shot time of those returns (mid-frame without returns): the
    # object's pose at that time, in the sensor frame at that time (raw) or at the frame start (deskewed).
    m_obj = len(scn.objects)
    obj_time = np.full(m_obj, period / 2)
    if m_obj:
        own = inst_all >= 0
        cnt = np.bincount(inst_all[own], minlength=m_obj)
        tsum = np.bincount(inst_all[own], weights=rel_t[own], minlength=m_obj)
        obj_time = np.where(cnt > 0, tsum / np.maximum(cnt, 1), obj_time)
    obj_shift = obj_vel * obj_time[:, None]  # world translation since the frame start
    if deskew or (ego_speed == 0.0 and omega == 0.0):  # one sensor pose for every box
        box_origin, box_rot = o0, R
    else:
        box_origin = ego_origin(t0 + obj_time).reshape(-1, 3)
        box_rot = np.stack([sensor_rot(t0 + ti) for ti in obj_time]).reshape(-1, 3, 3)
    boxes, keep, vel_s = _ground_truth(scn, prims, obj_rot, box_origin, box_rot, obj_shift)
    d0 = np.hypot(boxes[:, 0], boxes[:, 1]) if len(boxes) else np.zeros(0)
    kept_idx = np.nonzero(keep & (d0 <= max_box_range))[0]
    remap = np.full(len(scn.objects) + 1, -1, np.int64)  # last slot: "no object"
    remap[kept_idx] = np.arange(len(kept_idx))
    instance = remap[np.where(inst_all >= 0, inst_all, len(scn.objects))].astype(np.int32)
    num_points = np.bincount(instance[instance >= 0], minlength=len(kept_idx)).astype(np.int64)
    labels = scn.labels[kept_idx] if len(kept_idx) else np.zeros(0, np.int64)
    ids = np.array([scn.objects[i].object_id for i in kept_idx], dtype=np.int64)
    pose = np.eye(4)
    pose[:3, :3] = R
    pose[:3, 3] = o0
    return SimFrame(
        points=pts, time=rel_t, tag=tag, line=line.astype(np.uint8),
        boxes=boxes[kept_idx].astype(np.float32).reshape(-1, 7), labels=labels.astype(np.int64),
        num_points=num_points, sensor_height=h, sensor=sensor_model.name, instance=instance,
        object_ids=ids, velocities=vel_s[kept_idx].astype(np.float32).reshape(-1, 2),
        frame_index=int(frame_index), stamp=t0, pose=pose,
    )


def _ground_truth(scn: Scene, prims, obj_rot, o0, R, obj_shift=None):
    """Tight yaw-only boxes around every object's parts, in the sensor frame; keep mask for objects in
    front of the sensor. ``o0`` (3,) / ``R`` (3,3) is one sensor pose for all boxes, or (M,3) / (M,3,3)
    one per object; ``obj_shift`` (M,3) moves each object's parts in the world first."""
    m = len(scn.objects)
    if m == 0:
        return np.zeros((0, 7)), np.zeros(0, bool), np.zeros((0, 2))
    per_object = np.ndim(R) == 3
    owner = prims.instance
    sel = np.nonzero(owner >= 0)[0]
    own = owner[sel]
    order = np.argsort(own, kind="stable")
    sel, own = sel[order], own[order]
    parts = prims.take(sel)
    heading_w = obj_rot[:, :, 0]  # object x axis in world
    heading_s = np.einsum("mi,mij->mj", heading_w, R) if per_object else heading_w @ R  # = R^T h
    yaw = np.arctan2(heading_s[:, 1], heading_s[:, 0])
    c, s = np.cos(yaw), np.sin(yaw)
    zeros, ones = np.zeros(m), np.ones(m)
    # box axes in the sensor frame (3 x 3 per object: columns u, v, w) -> world
    axes_s = np.stack([np.stack([c, s, zeros], -1), np.stack([-s, c, zeros], -1), np.stack([zeros, zeros, ones], -1)], -1)
    axes_w = (R if per_object else R[None]) @ axes_s  # (m,3,3)
    ax_p = axes_w[own]  # (P,3,3)
    centres = parts.center if obj_shift is None else parts.center + obj_shift[own]
    rel = centres - (o0[own] if np.ndim(o0) == 2 else o0)
    proj = np.einsum("pij,pi->pj", ax_p, rel)  # coordinates along u, v, w
    # part extents along each object's box axes
    pr = np.einsum("pki,pkj->pij", parts.rot, ax_p) * parts.half[:, :, None]  # (P, local 3, axis 3)
    box_e = np.abs(pr).sum(1)
    ell_e = np.sqrt((pr ** 2).sum(1))
    cyl_e = np.abs(pr[:, 2]) + np.sqrt(pr[:, 0] ** 2 + pr[:, 1] ** 2)
    kind = parts.kind[:, None]
    from livox_infer.sim.geometry import CYLINDER, ELLIPSOID

    ext = np.where(kind == ELLIPSOID, ell_e, np.where(kind == CYLINDER, cyl_e, box_e))
    lo_p, hi_p = proj - ext, proj + ext
    starts = np.r_[0, np.nonzero(np.diff(own))[0] + 1]
    objs = own[starts]
    lo = np.full((m, 3), np.nan)
    hi = np.full((m, 3), np.nan)
    lo[objs] = np.minimum.reduceat(lo_p, starts, axis=0)
    hi[objs] = np.maximum.reduceat(hi_p, starts, axis=0)
    mid = (lo + hi) / 2
    dims = hi - lo
    # human-label slack around the tight extent (scene.LABEL_MARGIN)
    slack = np.array([LABEL_MARGIN[CLASS_NAMES[ob.label]] for ob in scn.objects])
    dims[:, :2] += 2 * slack[:, None]
    centre = mid[:, 0:1] * axes_s[:, :, 0] + mid[:, 1:2] * axes_s[:, :, 1] + mid[:, 2:3] * axes_s[:, :, 2]
    yaw_w = np.mod(yaw + np.pi, 2 * np.pi) - np.pi
    boxes = np.concatenate([centre, dims, yaw_w[:, None]], 1)
    keep = np.isfinite(boxes).all(1) & (boxes[:, 0] > 0.0)
    vel_w = np.stack([np.r_[ob.velocity, 0.0] for ob in scn.objects])
    vel_s = (np.einsum("mi,mij->mj", vel_w, R) if per_object else vel_w @ R)[:, :2]
    return boxes, keep, vel_s


def simulate_drive(sensor: str | SensorModel = "avia", seed: int = 0, n_frames: int = 10, speed_mps: float = 8.0,
                   scene: Scene | str | None = None, moving_objects: bool = True, **options) -> list[SimFrame]:
    """Drive the ego along the road at ``speed_mps`` through one scene; one SimFrame per period.

    Objects move with their velocities when ``moving_objects`` (also within each frame); boxes follow the
    time convention of :func:`simulate_frame` (docs/simulator.md).
    """
    return list(iter_drive(sensor, seed, n_frames, speed_mps, scene, moving_objects, **options))


def iter_drive(sensor: str | SensorModel = "avia", seed: int = 0, n_frames: int = 10, speed_mps: float = 8.0,
               scene: Scene | str | None = None, moving_objects: bool = True, **options) -> Iterator[SimFrame]:
    """:func:`simulate_drive` one frame at a time (long drives without holding every frame)."""
    if isinstance(n_frames, bool) or not isinstance(n_frames, (int, np.integer)) or n_frames < 1:
        raise ConfigError("n_frames must be an integer >= 1")
    if not (0.0 <= float(speed_mps) <= 70.0):
        raise ConfigError("speed_mps must be in 0..70")
    scene_kw, frame_kw = _split_options(options)
    period = float(frame_kw.get("period", 0.1))
    if isinstance(scene, Scene):
        scn = _resolve_scene(scene, seed, scene_kw)
    else:
        scene_kw.setdefault("length", 150.0 + speed_mps * n_frames * period)
        scene_kw.setdefault("moving", moving_objects)
        scene_kw.setdefault("ego_speed", speed_mps)
        scn = _resolve_scene(scene, seed, scene_kw)
    frame_kw["ego_speed"] = float(speed_mps)

    # the first frame is made now, so bad options raise here rather than halfway through a consumer
    first = simulate_frame(sensor, seed, 0, scn, **frame_kw)

    def frames() -> Iterator[SimFrame]:
        yield first
        for k in range(1, int(n_frames)):
            yield simulate_frame(sensor, seed, k, scn, **frame_kw)

    return frames()
