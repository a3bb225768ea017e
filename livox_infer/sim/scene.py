"""Procedural street / open scenes with labelled cars, pedestrians, cyclists, trucks and buses.

World frame: z up, the ego sensor starts above (0, ego_y) looking along +x; roads run along x.
Labelled objects are kept as parts in their own frame (origin on the ground under the footprint
centre, x = heading) plus a pose that may move with time; background is a fixed set of primitives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError
from livox_infer.sim.geometry import (
    BOX, CYLINDER, ELLIPSOID, RBOX, Ground, PrimitiveBuilder, Primitives, rot_x, rot_y, rot_z,
)
from livox_infer.sim.lookalikes import add_lookalikes

CAR, PEDESTRIAN, CYCLIST, TRUCK, BUS = 0, 1, 2, 3, 4
assert CLASS_NAMES == ("car", "pedestrian", "cyclist", "truck", "bus")

SCENE_MODES = ("street", "open")
# Annotation slack, m per side along length and width: human-labelled boxes leave a gap between the box and the
# outermost returns (real_dev, cars with >= 50 points within 40 m, median gap to the 98th-percentile return: KITTI
# 5 cm at the ends / 2 cm at the sides, Argoverse 2 13 / 12 cm), while boxes tight around the parts put the faces on
# the returns. A detector trained on tight boxes places real boxes ~0.2 m too far from the sensor (docs/simulator.md).
# Labels are the parts' tight extent plus this slack; car bodies are built this much smaller, so label sizes keep
# the statistics the body sampling was made for.
LABEL_MARGIN = {"car": 0.07, "pedestrian": 0.0, "cyclist": 0.0, "truck": 0.1, "bus": 0.1}


@dataclass
class SceneObject:
    label: int  # index into CLASS_NAMES
    parts: Primitives  # in the object frame; instance filled in at assembly
    position: np.ndarray  # (3,) world, ground point under the footprint centre at t=0
    yaw: float  # heading at t=0 (world)
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(2))  # world m/s along x, y
    object_id: int = 0

    def position_at(self, t: float) -> np.ndarray:
        p = self.position.copy()
        p[:2] += self.velocity * t
        return p


@dataclass
class Scene:
    mode: str
    seed: int
    ground: Ground
    static: Primitives
    objects: list[SceneObject]
    ego_y: float = 0.0  # lateral position of the ego lane (world y)
    ground_tilt: np.ndarray = field(default_factory=lambda: np.eye(3))
    extent_x: tuple[float, float] = (-30.0, 150.0)

    def primitives_at(self, t: float) -> tuple[Primitives, np.ndarray, np.ndarray]:
        """All primitives at scene time t, plus each object's world position and rotation."""
        if not self.objects:
            return self.static, np.zeros((0, 3)), np.zeros((0, 3, 3))
        pos = np.stack([ob.position_at(t) for ob in self.objects])
        # heights follow the ground under the moving object
        moved = np.array([np.any(ob.velocity != 0) for ob in self.objects])
        if moved.any():
            base = np.array([ob.position[2] - self.ground.height(ob.position[0], ob.position[1])
                             for ob in self.objects])
            pos[:, 2] = np.where(moved, self.ground.height(pos[:, 0], pos[:, 1]) + base, pos[:, 2])
        rots = self.ground_tilt[None] @ rot_z(np.array([ob.yaw for ob in self.objects]))
        parts = Primitives.concat([ob.parts for ob in self.objects])
        owner = np.concatenate([np.full(len(ob.parts), i, np.int32) for i, ob in enumerate(self.objects)])
        r = rots[owner]
        parts.center = pos[owner] + np.einsum("pij,pj->pi", r, parts.center)
        parts.rot = r @ parts.rot
        parts.instance = owner
        return Primitives.concat([self.static, parts]), pos, rots

    @property
    def labels(self) -> np.ndarray:
        return np.array([ob.label for ob in self.objects], dtype=np.int64)


def _pick(rng, items, probs):
    """rng.choice with probabilities, without its per-call overhead (scene building calls it a lot)."""
    u = rng.random()
    acc = 0.0
    for item, p in zip(items, probs):
        acc += p
        if u < acc:
            return item
    return items[-1]


def _sign(rng) -> float:
    return -1.0 if rng.random() < 0.5 else 1.0


# ------------------------------------------------------------------------------------- materials
def _paint(rng) -> float:
    # car colours: black/dark, grey/silver, white, coloured (NIR reflectance)
    k = int(np.searchsorted(_PAINT_CDF, rng.random()))
    return float(_PAINT_REFLECT[min(k, 4)] * rng.uniform(0.8, 1.2))


_PAINT_REFLECT = (0.04, 0.1, 0.25, 0.4, 0.55)
_PAINT_CDF = np.cumsum([0.25, 0.2, 0.2, 0.2, 0.15])


# ------------------------------------------------------------------------------------ object parts
def build_car(rng: np.random.Generator, kind: str | None = None) -> Primitives:
    """A car as a LiDAR sees it: lower body with wheel wells, glass greenhouse (mostly transparent)
    with seats behind it, metal roof, wheels, retro-reflective plates and tail lights."""
    kind = kind or _pick(rng, ("sedan", "hatch", "suv", "van"), (0.45, 0.25, 0.22, 0.08))
    # KITTI cars average 3.8 x 1.6 m, Argoverse 2 (US) 4.4 x 1.9 m: cover both
    L = float(np.clip(rng.normal(4.05, 0.45), 3.2, 5.6))
    W = float(rng.uniform(1.6, 2.0))
    H = float(np.clip(rng.normal(1.5, 0.15), 1.3, 1.95))
    if kind == "suv":
        H = float(np.clip(H + 0.2, 1.55, 1.95))
    if kind == "van":
        L = float(np.clip(L + 0.6, 4.2, 5.3))
        H = float(np.clip(H + 0.35, 1.8, 2.1))
    # the body is the label minus the annotation slack (the label adds it back)
    L -= 2 * LABEL_MARGIN["car"]
    W -= 2 * LABEL_MARGIN["car"]
    b = PrimitiveBuilder()
    paint = _paint(rng)
    rw = float(rng.uniform(0.29, 0.36))  # wheel radius
    gc = float(rng.uniform(0.14, 0.22))  # ground clearance
    wb = L * rng.uniform(0.58, 0.64)  # wheelbase
    belt = H * rng.uniform(0.58, 0.66) if kind != "van" else H * 0.5
    x_mid = 0.0 if kind == "van" else rng.uniform(-0.05, 0.02) * L
    upper_z = rw * 1.35  # top of the wheel wells
    # lower body above the wheels
    b.add(RBOX, (0, 0, (upper_z + belt) / 2), (L / 2, W / 2, (belt - upper_z) / 2), reflect=paint)
    # side skirt between the wheels, bumpers in front/behind the wheels
    well = rw + 0.06
    b.add(BOX, (x_mid, 0, (gc + upper_z) / 2), (wb / 2 - well, W / 2 - 0.02, (upper_z - gc) / 2), reflect=paint)
    front0, rear0 = x_mid + wb / 2 + well, x_mid - wb / 2 - well
    if L / 2 > front0 + 0.05:
        b.add(RBOX, ((front0 + L / 2) / 2, 0, (gc + 0.1 + upper_z) / 2),
              ((L / 2 - front0) / 2, W / 2 - 0.03, (upper_z - gc - 0.1) / 2), reflect=paint)
    if -L / 2 < rear0 - 0.05:
        b.add(RBOX, ((rear0 - L / 2) / 2, 0, (gc + 0.1 + upper_z) / 2),
              ((rear0 + L / 2) / 2, W / 2 - 0.03, (upper_z - gc - 0.1) / 2), reflect=paint)
    # greenhouse: front/rear ends by body type
    if kind == "van":
        c_front, c_rear = L / 2 - 0.55, -L / 2 + 0.02
    elif kind == "suv":
        c_front, c_rear = L / 2 - 0.32 * L, -L / 2 + 0.08 * L
    elif kind == "hatch":
        c_front, c_rear = L / 2 - 0.34 * L, -L / 2 + 0.06 * L
    else:
        c_front, c_rear = L / 2 - 0.36 * L, -L / 2 + 0.2 * L
    roof_t = 0.07
    gh = H - roof_t - belt  # greenhouse glass height
    slant_f = min(0.7 * gh, 0.5) if kind != "van" else 0.25 * gh
    slant_r = min(0.5 * gh, 0.35) if kind in ("sedan",) else 0.12 * gh
    cw = W / 2 - 0.08
    g0, g1 = c_rear + slant_r, c_front - slant_f
    # side windows lean inwards (tumblehome): separate near and far panes, so a ray can pass the near
    # window, miss the seats and still return from the far one
    tumble = float(rng.uniform(0.08, 0.16))
    lean = np.arctan2(tumble, gh)
    pane = float(np.hypot(tumble, gh))
    for side in (1.0, -1.0):
        centre = ((g0 + g1) / 2, side * (cw - tumble / 2), belt + gh / 2)
        b.add(BOX, centre, ((g1 - g0) / 2 + 0.02, 0.012, pane / 2), rot_x(side * lean), reflect=0.08, hit_prob=0.3)
        # B-pillar: a solid strip in the middle of the side glass, just outside it
        b.add(BOX, (centre[0], side * (cw - tumble / 2 + 0.015), centre[2]), (0.05, 0.012, pane / 2),
              rot_x(side * lean), reflect=paint)
    # windscreen and rear window: thin slanted glass panels
    for x_lo, x_hi, sign in ((g1, c_front, 1.0), (c_rear, g0, -1.0)):
        run = x_hi - x_lo
        if run < 0.02:
            continue
        length = float(np.hypot(run, gh))
        ang = np.arctan2(run, gh) * sign  # tilt about y (top leans back)
        b.add(BOX, ((x_lo + x_hi) / 2, 0, belt + gh / 2), (0.015, cw - tumble / 2 - 0.02, length / 2),
              rot_y(-ang), reflect=0.08, hit_prob=0.35)
    # roof
    b.add(RBOX, ((g0 + g1) / 2, 0, H - roof_t / 2), ((g1 - g0) / 2 + 0.05, cw - tumble, roof_t / 2), reflect=paint)
    # interior: seats and dashboard seen through the glass
    b.add(BOX, ((g0 + g1) / 2, 0, belt + 0.15), (max((g1 - g0) / 2, 0.3), cw - 0.12, 0.3), reflect=0.12)
    # wheels (tyres are dark); axis along the car's y
    for xs in (x_mid + wb / 2, x_mid - wb / 2):
        for ys in (W / 2 - 0.13, -(W / 2 - 0.13)):
            b.add(CYLINDER, (xs, ys, rw), (rw, rw, 0.1), rot_x(np.pi / 2), reflect=0.05)
    # licence plates (retro) and tail lights (retro, weaker)
    pz = upper_z - 0.05
    b.add(BOX, (L / 2 + 0.005, 0, pz), (0.01, 0.26, 0.06), reflect=0.85, retro=True)
    b.add(BOX, (-L / 2 - 0.005, 0, pz + 0.15), (0.01, 0.26, 0.06), reflect=0.85, retro=True)
    for ys in (W / 2 - 0.15, -(W / 2 - 0.15)):
        b.add(BOX, (-L / 2 - 0.004, ys, belt - 0.12), (0.01, 0.12, 0.06), reflect=0.45, retro=True)
    return b.build()


def build_pedestrian(rng: np.random.Generator) -> Primitives:
    """Legs (apart when walking), feet, torso, arms, head; sometimes a bag."""
    H = float(rng.uniform(1.5, 1.9))
    b = PrimitiveBuilder()
    cloth = float(rng.uniform(0.05, 0.45))
    trousers = float(rng.uniform(0.08, 0.45))
    skin = float(rng.uniform(0.25, 0.45))
    walking = rng.random() < 0.7
    stride = float(rng.uniform(0.18, 0.38)) if walking else float(rng.uniform(0.06, 0.16))
    hip_z = 0.5 * H
    leg_len = hip_z - 0.04
    lr = float(rng.uniform(0.06, 0.08))
    hip_w = float(rng.uniform(0.09, 0.12))
    swing = np.arcsin(np.clip(stride / leg_len, -0.9, 0.9))
    for sgn, side in ((1.0, 1.0), (-1.0, -1.0)):
        a = sgn * swing
        foot_x = np.sin(a) * leg_len
        cx = foot_x / 2
        # rot_y(-a) tips the leg's top back over the hip and its foot forward to foot_x
        b.add(CYLINDER, (cx, side * hip_w, 0.04 + leg_len / 2), (lr, lr, leg_len / 2), rot_y(-a), reflect=trousers)
        b.add(BOX, (foot_x + 0.05, side * hip_w, 0.04), (0.13, 0.05, 0.04), reflect=0.1)
    shoulder_z = 0.82 * H
    tw = float(rng.uniform(0.17, 0.22))  # half shoulder width
    td = float(rng.uniform(0.1, 0.14))  # half torso depth
    b.add(CYLINDER, (0.0, 0.0, (hip_z + shoulder_z) / 2), (td, tw, (shoulder_z - hip_z) / 2 + 0.03), reflect=cloth)
    # head + neck
    hr = float(rng.uniform(0.085, 0.1))
    head_z = H - hr * 1.15
    b.add(ELLIPSOID, (0.01, 0.0, head_z), (hr, hr * 0.85, hr * 1.15), reflect=skin)
    b.add(CYLINDER, (0.0, 0.0, (shoulder_z + head_z) / 2), (0.05, 0.05, (head_z - shoulder_z) / 2), reflect=skin)
    # arms swing opposite to the legs
    arm_len = 0.36 * H
    for sgn, side in ((-1.0, 1.0), (1.0, -1.0)):
        a = sgn * swing * 0.8
        cx = -np.sin(a) * arm_len / 2
        b.add(CYLINDER, (cx, side * (tw + 0.045), shoulder_z - 0.03 - arm_len / 2 * np.cos(a)),
              (0.045, 0.045, arm_len / 2), rot_y(a), reflect=cloth)
    if rng.random() < 0.3:  # backpack
        b.add(BOX, (-td - 0.09, 0, shoulder_z - 0.2), (0.09, tw * 0.8, 0.2), reflect=float(rng.uniform(0.1, 0.5)))
    return b.build()


def build_cyclist(rng: np.random.Generator, rider: bool = True) -> Primitives:
    """Bicycle (wheels mostly spokes, thin frame, handlebar) with a rider leaning forward.
    ``rider=False`` gives a parked bicycle (not a 'cyclist': used as unlabelled clutter)."""
    b = PrimitiveBuilder()
    rw = float(rng.uniform(0.33, 0.36))
    wb = float(rng.uniform(0.98, 1.12))
    fx, rx = wb / 2, -wb / 2
    frame = float(rng.uniform(0.15, 0.6))
    n_seg = 10
    seg_half = np.pi * rw / n_seg + 0.01
    for x in (fx, rx):
        b.add(CYLINDER, (x, 0, rw), (rw - 0.04, rw - 0.04, 0.015), rot_x(np.pi / 2), reflect=0.3, hit_prob=0.07)  # spokes
        b.add(CYLINDER, (x, 0, rw), (0.05, 0.05, 0.06), rot_x(np.pi / 2), reflect=0.3)  # hub
        for k in range(n_seg):  # tyre: a ring of short segments (solid, dark rubber)
            th = 2 * np.pi * (k + 0.5) / n_seg
            c = (x + (rw - 0.02) * np.cos(th), 0.0, rw + (rw - 0.02) * np.sin(th))
            b.add(BOX, c, (0.02, 0.018, seg_half), rot_y(-th), reflect=0.05)
    crank = np.array([-0.02, 0.0, rw + 0.0])
    seat = np.array([rx + 0.32, 0.0, rw + float(rng.uniform(0.52, 0.62))])
    head = np.array([fx - 0.16, 0.0, rw + 0.55])
    bar = np.array([fx - 0.2, 0.0, rw + float(rng.uniform(0.62, 0.72))])

    def tube(p0, p1, r, refl, hit=0.8):
        p0, p1 = np.asarray(p0, float), np.asarray(p1, float)
        v = p1 - p0
        length = float(np.linalg.norm(v))
        ang = np.arctan2(v[0], v[2])  # rotation about y taking z onto v (v in the x-z plane)
        b.add(CYLINDER, (p0 + p1) / 2, (r, r, length / 2), rot_y(ang), reflect=refl, hit_prob=hit)

    tube(crank, seat, 0.02, frame)  # seat tube
    tube(seat, head, 0.02, frame)  # top tube
    tube(crank, head, 0.025, frame)  # down tube
    tube((rx, 0, rw), crank, 0.015, frame)  # chain stay
    tube((fx, 0, rw), head, 0.018, frame)  # fork
    bar_half = float(rng.uniform(0.24, 0.34))
    b.add(CYLINDER, bar, (0.015, 0.015, bar_half), rot_x(np.pi / 2), reflect=0.2)
    if not rider:
        b.add(BOX, seat + np.array([0.0, 0.0, 0.03]), (0.13, 0.07, 0.03), reflect=0.1)  # saddle
        return b.build()
    # rider
    cloth = float(rng.uniform(0.05, 0.45))
    trousers = float(rng.uniform(0.08, 0.45))
    hip = seat + np.array([0.0, 0.0, 0.08])
    lean = float(rng.uniform(0.35, 0.75))  # torso angle from vertical (rad)
    torso_len = float(rng.uniform(0.5, 0.6))
    shoulder = hip + torso_len * np.array([np.sin(lean), 0.0, np.cos(lean)])
    b.add(CYLINDER, (hip + shoulder) / 2, (0.12, 0.19, torso_len / 2 + 0.03), rot_y(lean), reflect=cloth)
    hr = float(rng.uniform(0.085, 0.1))
    head_c = shoulder + np.array([0.05, 0.0, 0.1 + hr])
    helmet = rng.random() < 0.5
    b.add(ELLIPSOID, head_c, (hr * 1.2, hr * 0.95, hr * 1.05) if helmet else (hr, hr * 0.85, hr * 1.15),
          reflect=float(rng.uniform(0.2, 0.7)) if helmet else 0.35)
    phase = float(rng.uniform(0, 2 * np.pi))
    for side, ph in ((1.0, phase), (-1.0, phase + np.pi)):
        pedal = crank + np.array([0.17 * np.cos(ph), 0.0, 0.17 * np.sin(ph)])
        hp = hip + np.array([0, side * 0.1, 0])
        pd = pedal + np.array([0, side * 0.1, 0])
        # knee: forward and up of the hip-pedal midpoint so the thigh and shin keep their lengths
        mid = (hp + pd) / 2
        span = np.linalg.norm(pd - hp)
        seg = 0.46
        bend = np.sqrt(max(seg ** 2 - (span / 2) ** 2, 0.0))
        dvec = (pd - hp) / max(span, 1e-6)
        perp = np.array([dvec[2], 0.0, -dvec[0]])
        if perp[0] < 0:
            perp = -perp
        knee = mid + perp * bend
        tube(hp, knee, 0.075, trousers, 1.0)
        tube(knee, pd, 0.06, trousers, 1.0)
        hand = bar + np.array([0.0, side * (bar_half - 0.05), 0.0])
        sh = shoulder + np.array([0, side * 0.18, 0])
        v = hand - sh
        length = float(np.linalg.norm(v))
        # arm as a cylinder from shoulder to hand (3D direction): build a rotation taking z onto v
        zax = v / length
        xax = np.cross([0.0, 1.0, 0.0], zax)
        xax = xax / max(np.linalg.norm(xax), 1e-9)
        yax = np.cross(zax, xax)
        b.add(CYLINDER, (sh + hand) / 2, (0.045, 0.045, length / 2), np.stack([xax, yax, zax], 1), reflect=cloth)
    return b.build()


def parts_extent(parts: Primitives, axes: np.ndarray) -> np.ndarray:
    """Half extent of every part along unit vectors ``axes`` (3,K) -> (P,K); exact per shape."""
    proj = np.einsum("pij,ik->pjk", parts.rot, axes) * parts.half[:, :, None]  # (P,3 local,K)
    box = np.abs(proj).sum(1)
    ell = np.sqrt((proj ** 2).sum(1))
    cyl = np.abs(proj[:, 2]) + np.sqrt(proj[:, 0] ** 2 + proj[:, 1] ** 2)
    kind = parts.kind[:, None]
    return np.where(kind == ELLIPSOID, ell, np.where(kind == CYLINDER, cyl, box))


# ---------------------------------------------------------------------------------- background
def _add_tree(b: PrimitiveBuilder, rng, x, y, z0):
    trunk_h = float(rng.uniform(1.8, 3.5))
    tr = float(rng.uniform(0.08, 0.25))
    b.add(CYLINDER, (x, y, z0 + trunk_h / 2), (tr, tr, trunk_h / 2 + 0.2), reflect=float(rng.uniform(0.15, 0.3)))
    crown_r = float(rng.uniform(1.5, 3.8))
    n_blobs = int(rng.integers(1, 4))
    for _ in range(n_blobs):
        off = rng.normal(0, crown_r * 0.3, 3)
        r = crown_r * rng.uniform(0.6, 1.0)
        b.add(ELLIPSOID, (x + off[0], y + off[1], z0 + trunk_h + r * 0.8 + abs(off[2])),
              (r, r * rng.uniform(0.8, 1.1), r * rng.uniform(0.7, 1.1)),
              reflect=float(rng.uniform(0.25, 0.5)), volume_k=float(rng.uniform(0.6, 2.5)))


def _add_background(b: PrimitiveBuilder, rng, ground: Ground, x_lo: float, x_hi: float, clear_half: float,
                    clutter: float) -> None:
    """Far content seen over and between the near scene: tree groups and buildings 20-150 m out,
    outside the corridor |y| < clear_half (the road). Real Livox scans get half their returns there."""
    n_groups = int(rng.integers(6, 16) * clutter * max(1.0, (x_hi - x_lo) / 180.0))
    for _ in range(n_groups):
        x = float(rng.uniform(max(x_lo, 15.0), x_hi + 40))
        y = _sign(rng) * float(clear_half + rng.exponential(25.0))
        if rng.random() < 0.7:
            for _ in range(int(rng.integers(2, 9))):
                tx, ty = x + rng.normal(0, 6), y + rng.normal(0, 6)
                if abs(ty) > clear_half:
                    _add_tree(b, rng, tx, ty, ground.plane(tx, ty))
        else:
            ln, dp, h = rng.uniform(10, 40), rng.uniform(8, 20), rng.uniform(4, 25)
            if abs(y) - dp / 2 > clear_half:
                b.add(BOX, (x, y, ground.plane(x, y) + h / 2 - 0.5), (ln / 2, dp / 2, h / 2 + 0.5),
                      rot_z(float(rng.normal(0, 0.3))), reflect=float(rng.uniform(0.08, 0.3)))


def _add_skyline(b: PrimitiveBuilder, rng, ground: Ground, x0: float, x1: float, y_half: float,
                 clutter: float) -> None:
    """Buildings and tree rows across the far end of the view (x0..x1): most real scans see something
    60-150 m ahead above the horizon rather than open sky."""
    y = -y_half
    while y < y_half:
        w = float(rng.uniform(10, 45))
        x = float(rng.uniform(x0, x1))
        if rng.random() < 0.75 * min(clutter, 1.3):
            if rng.random() < 0.6:
                h = float(rng.uniform(6, 30))
                b.add(BOX, (x + 8, y + w / 2, ground.plane(x, y) + h / 2 - 0.5), (8.0, w / 2, h / 2 + 0.5),
                      rot_z(float(rng.normal(0, 0.15))), reflect=float(rng.uniform(0.08, 0.3)))
            else:
                for _ in range(int(w / 6) + 1):
                    tx, ty = x + rng.normal(0, 3), y + rng.uniform(0, w)
                    _add_tree(b, rng, tx, ty, ground.plane(tx, ty))
        y += w + float(rng.uniform(0, 15))


def _add_pole(b: PrimitiveBuilder, rng, x, y, z0, yaw_to_road: float):
    h = float(rng.uniform(3.0, 9.0))
    r = float(rng.uniform(0.04, 0.13))
    b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=float(rng.uniform(0.1, 0.35)))
    u = rng.random()
    if u < 0.35:  # traffic sign, retro-reflective, faces the road
        s = float(rng.uniform(0.3, 0.45))
        zc = z0 + float(rng.uniform(2.0, 2.8))
        b.add(BOX, (x, y, zc), (0.01, s, s), rot_z(yaw_to_road), reflect=0.8, retro=True)
    elif u < 0.65 and h > 5:  # street light arm
        arm = float(rng.uniform(1.0, 2.5))
        toward_road = -np.sign(y) if y != 0 else 1.0
        b.add(BOX, (x, y + toward_road * arm / 2, z0 + h), (0.08, arm / 2, 0.05), reflect=0.3)


def _add_truck_cab(b: PrimitiveBuilder, length: float, cab: float, w: float, wheel_r: float, paint: float) -> None:
    """A box truck's or flatbed's cab at the front (+x) end, with its windscreen."""
    b.add(BOX, (length / 2 - cab / 2, 0, wheel_r + 1.2), (cab / 2, w / 2 - 0.05, 1.2), reflect=paint)
    b.add(BOX, (length / 2 - cab + 0.05, 0, wheel_r + 1.9), (0.02, w / 2 - 0.2, 0.45), reflect=0.08, hit_prob=0.35)


def build_large_vehicle(rng: np.random.Generator, kind: str | None = None) -> tuple[int, Primitives]:
    """A truck or a bus, big wheels; ``kind`` "truck" / "bus" or None (either, evenly). Trucks: a box truck (cab +
    cargo box, half of them), a tractor-trailer (a low cab and a 4 m high trailer, 15-16.8 m in all, 3 in 10) or a
    flatbed (cab + a deck at 1.2 m, bare or with a load, 2 in 10). Buses: a city bus (one long body with a window
    band, 6 in 10), an articulated bus (two bodies and a joint, 17.5-18.7 m, 2 in 10) or a coach (3.4-3.8 m high,
    12-13.8 m, 2 in 10). Returns (label, parts in the object frame). The scene's stream ``rng`` makes the draws the
    unlabelled large vehicles of earlier simulator versions made (so seeded scenes keep their box trucks and city
    buses); the body style and its sizes come from a stream of its own, seeded by the paint draw."""
    wheel_r = float(rng.uniform(0.45, 0.55))
    w = float(rng.uniform(2.3, 2.55))
    paint = float(rng.uniform(0.1, 0.6))
    u = rng.random()
    truck = u < 0.5 if kind is None else kind == "truck"
    style = np.random.default_rng(int(paint * 2 ** 32))
    v = float(style.random())
    b = PrimitiveBuilder()
    if truck:
        length = float(rng.uniform(6.5, 9.5))
        cab = 2.2
        h = float(rng.uniform(3.0, 3.8))
        cargo_reflect = float(rng.uniform(0.3, 0.7))
        if v < 0.5:  # box truck
            _add_truck_cab(b, length, cab, w, wheel_r, paint)
            cargo = length - cab - 0.2
            b.add(BOX, (-length / 2 + cargo / 2, 0, wheel_r + 0.35 + (h - wheel_r - 0.35) / 2),
                  (cargo / 2, w / 2, (h - wheel_r - 0.35) / 2), reflect=cargo_reflect)
            axles = (length / 2 - 1.3, -length / 2 + 1.6)
        elif v < 0.8:  # tractor-trailer: the trailer's front rides over the tractor's rear axle
            length = float(style.uniform(15.0, 16.8))
            cab = float(style.uniform(2.2, 2.6))
            top = float(style.uniform(3.8, 4.1))
            deck = float(style.uniform(1.1, 1.3))
            b.add(BOX, (length / 2 - cab / 2, 0, wheel_r + 1.25), (cab / 2, w / 2 - 0.1, 1.25), reflect=paint)
            b.add(BOX, (length / 2 - cab / 2, 0, wheel_r + 1.9), (cab / 2 + 0.02, w / 2 - 0.25, 0.4), reflect=0.08,
                  hit_prob=0.35)
            b.add(BOX, (length / 2 - cab - 1.2, 0, wheel_r + 0.25), (1.2, 0.45, 0.15), reflect=0.1)  # chassis
            trailer = length - cab - 0.6
            b.add(BOX, (-length / 2 + trailer / 2, 0, (deck + top) / 2), (trailer / 2, w / 2, (top - deck) / 2),
                  reflect=cargo_reflect)
            axles = (length / 2 - 1.4, length / 2 - cab - 1.6, -length / 2 + 1.3, -length / 2 + 2.6)
        else:  # flatbed: cab, a low deck, a load on most
            _add_truck_cab(b, length, cab, w, wheel_r, paint)
            deck_len = length - cab - 0.2
            deck = wheel_r + 0.7
            b.add(BOX, (-length / 2 + deck_len / 2, 0, deck), (deck_len / 2, w / 2, 0.12), reflect=cargo_reflect)
            if style.random() < 0.7:
                load = float(style.uniform(0.3, 0.9)) * deck_len
                load_h = float(style.uniform(0.5, 1.8))
                at = -length / 2 + float(style.uniform(0.1, deck_len - load - 0.1 + 1e-6)) + load / 2
                b.add(BOX, (at, 0, deck + 0.12 + load_h / 2), (load / 2, w / 2 - 0.15, load_h / 2),
                      reflect=float(style.uniform(0.1, 0.7)))
            axles = (length / 2 - 1.3, -length / 2 + 1.6)
    else:
        length = float(rng.uniform(10.0, 12.5))
        h = float(rng.uniform(2.9, 3.3))
        band = 1.9  # window band centre above the ground
        if v < 0.2:  # articulated: two bodies, a dark joint between them
            length = float(style.uniform(17.5, 18.7))
            front = length * 0.58
            rear = length - front - 0.7
            b.add(BOX, (length / 2 - front / 2, 0, 0.35 + (h - 0.35) / 2), (front / 2, w / 2, (h - 0.35) / 2),
                  reflect=paint)
            b.add(BOX, (-length / 2 + rear / 2, 0, 0.35 + (h - 0.35) / 2), (rear / 2, w / 2, (h - 0.35) / 2),
                  reflect=paint)
            b.add(BOX, (length / 2 - front - 0.35, 0, 0.5 + (h - 0.6) / 2), (0.35, w / 2 - 0.15, (h - 0.6) / 2),
                  reflect=0.05)
            axles = (length / 2 - 2.5, length / 2 - front + 1.0, -length / 2 + 2.2)
        else:
            if v < 0.4:  # coach: taller, longer, the windows higher
                length = float(style.uniform(12.0, 13.8))
                h = float(style.uniform(3.4, 3.8))
                band = h - 1.1
            b.add(BOX, (0, 0, 0.35 + (h - 0.35) / 2), (length / 2, w / 2, (h - 0.35) / 2), reflect=paint)
            axles = (length / 2 - 2.5, -length / 2 + 3.0)
        for side in (-1, 1):  # window band
            b.add(BOX, (0, side * (w / 2 + 0.01), band), (length / 2 - 0.8, 0.02, 0.5), reflect=0.08, hit_prob=0.4)
    for ax in axles:
        for side in (-1, 1):
            b.add(CYLINDER, (ax, side * (w / 2 - 0.25), wheel_r), (wheel_r, wheel_r, 0.15), rot_x(np.pi / 2),
                  reflect=0.05)
    return (TRUCK if truck else BUS), b.build()


def build_truck(rng: np.random.Generator) -> Primitives:
    return build_large_vehicle(rng, "truck")[1]


def build_bus(rng: np.random.Generator) -> Primitives:
    return build_large_vehicle(rng, "bus")[1]


BUILDERS = {CAR: build_car, PEDESTRIAN: build_pedestrian, CYCLIST: build_cyclist, TRUCK: build_truck, BUS: build_bus}
# upper bounds of the footprint radius each builder can produce (m), for cheap placement checks
MAX_RADIUS = {CAR: 3.0, PEDESTRIAN: 0.75, CYCLIST: 1.15, TRUCK: 5.1, BUS: 6.4}


def _place_parts(b: PrimitiveBuilder, parts: Primitives, x: float, y: float, z0: float, yaw: float) -> None:
    """Add an object's parts (object frame) to the background at a pose."""
    R = rot_z(yaw)
    centers = parts.center @ R.T + np.array([x, y, z0])
    for i in range(len(parts)):
        b.add(int(parts.kind[i]), centers[i], parts.half[i], R @ parts.rot[i], reflect=float(parts.reflect[i]),
              retro=bool(parts.retro[i]), hit_prob=float(parts.hit_prob[i]), volume_k=float(parts.volume_k[i]))


def _add_clutter(b: PrimitiveBuilder, rng, x, y, z0, yaw):
    u = rng.random()
    R = rot_z(yaw)
    if u < 0.1:  # parked bicycles side by side: a bicycle without a rider is not a cyclist
        n = int(rng.integers(1, 4))
        for k in range(n):
            off = (k - (n - 1) / 2) * 0.6
            _place_parts(b, build_cyclist(rng, rider=False), x - np.sin(yaw) * off, y + np.cos(yaw) * off, z0,
                         yaw + float(rng.normal(0, 0.1)))
        return
    u = rng.random()
    if u < 0.25:  # wheelie bin
        b.add(BOX, (x, y, z0 + 0.53), (0.3, 0.3, 0.53), R, reflect=float(rng.uniform(0.05, 0.4)))
    elif u < 0.4:  # round litter bin / bollard
        r = float(rng.uniform(0.1, 0.3))
        h = float(rng.uniform(0.8, 1.1))
        b.add(CYLINDER, (x, y, z0 + h / 2), (r, r, h / 2), reflect=float(rng.uniform(0.1, 0.5)))
    elif u < 0.55:  # bush
        r = float(rng.uniform(0.5, 1.5))
        b.add(ELLIPSOID, (x, y, z0 + r * 0.6), (r, r * rng.uniform(0.7, 1.3), r * 0.7), reflect=0.4,
              volume_k=float(rng.uniform(2.0, 5.0)))
    elif u < 0.68:  # bench
        b.add(BOX, (x, y, z0 + 0.45), (0.9, 0.25, 0.05), R, reflect=0.3)
        b.add(BOX, (x, y, z0 + 0.7), (0.9, 0.04, 0.2), R @ rot_z(0.0), reflect=0.3)
    elif u < 0.78:  # cardboard boxes / crates
        s = rng.uniform(0.3, 0.8, 3)
        b.add(BOX, (x, y, z0 + s[2] / 2), s / 2, R, reflect=0.5)
    elif u < 0.88:  # barrier / fence segment (partially transparent)
        ln = float(rng.uniform(1.5, 4.0))
        h = float(rng.uniform(0.8, 1.3))
        b.add(BOX, (x, y, z0 + h / 2), (ln / 2, 0.03, h / 2), R, reflect=0.4, hit_prob=float(rng.uniform(0.3, 1.0)))
    elif u < 0.94:  # scooter / motorbike-sized unlabeled object
        b.add(BOX, (x, y, z0 + 0.55), (0.9, 0.3, 0.45), R, reflect=0.2)
        b.add(CYLINDER, (x, y, z0 + 0.3), (0.3, 0.3, 0.06), R @ rot_x(np.pi / 2), reflect=0.05)
    else:  # electrical box / hydrant
        s = rng.uniform(0.3, 1.2, 3)
        s[2] = rng.uniform(0.6, 1.5)
        b.add(BOX, (x, y, z0 + s[2] / 2), s / 2, R, reflect=float(rng.uniform(0.2, 0.6)))


def _add_building(b: PrimitiveBuilder, rng, x0, x1, y_face, side, z0):
    """A building block whose facade is at y_face, extending away from the road (side = +1 left)."""
    depth = float(rng.uniform(6, 15))
    h = float(rng.uniform(3.0, 22.0))
    yc = y_face + side * depth / 2
    b.add(BOX, ((x0 + x1) / 2, yc, z0 + h / 2 - 0.5), ((x1 - x0) / 2, depth / 2, h / 2 + 0.5),
          reflect=float(rng.uniform(0.08, 0.3)))
    # windows: dark glass bands on the facade (rays pass into the building and return from inside)
    if h > 4 and rng.random() < 0.7:
        n_floors = int(h // 3)
        for k in range(n_floors):
            zc = z0 + 1.6 + 3.0 * k
            if zc + 0.8 > z0 + h:
                break
            b.add(BOX, ((x0 + x1) / 2, y_face + side * 0.01, zc), ((x1 - x0) / 2 - 0.5, 0.03, 0.7),
                  reflect=0.08, hit_prob=0.4)


# ------------------------------------------------------------------------------------- scenes
def _ground(rng, mode: str, road_half: float) -> Ground:
    # waviness: mm over metres, cm over tens of metres; steeper short waves would cast stripes of shadow
    # at grazing incidence, which real scans do not show
    k_amp = np.r_[rng.uniform(0.001, 0.005, 2), rng.uniform(0.005, 0.03, 3)]
    k_len = np.r_[rng.uniform(3.0, 8.0, 2), rng.uniform(15.0, 60.0, 3)]  # max slope ~1 %
    k_dir = rng.uniform(0, 2 * np.pi, 5)
    kv = np.stack([np.cos(k_dir), np.sin(k_dir)], 1) * (2 * np.pi / k_len)[:, None]
    slope_x = float(rng.normal(0, 0.015))
    slope_y = float(rng.normal(0, 0.008))
    if mode == "street":
        lane_w = 3.4
        marks = [0.0] + [s * lane_w * k for k in (1, 2) for s in (1, -1) if lane_w * k < road_half - 1.0]
        marks = np.array(marks, dtype=np.float64)
        refl = float(rng.uniform(0.07, 0.13))
    else:
        marks = np.zeros(0)
        refl = float(rng.uniform(0.07, 0.2))
    camber = 0.0
    if mode == "street" and rng.random() < 0.8:
        camber = float(rng.uniform(0.02, 0.12)) / road_half ** 2  # crown: edge 2-12 cm below the centre
    return Ground(slope_x, slope_y, k_amp, kv, rng.uniform(0, 2 * np.pi, 5), refl, marks, camber=camber,
                  camber_half=road_half)


class _Placer:
    """Footprint-circle collision checks for placing objects and clutter."""

    def __init__(self):
        self._xyr = np.zeros((64, 3))
        self._n = 0

    def free(self, x: float, y: float, r: float) -> bool:
        a = self._xyr[: self._n]
        return bool(np.all((a[:, 0] - x) ** 2 + (a[:, 1] - y) ** 2 > (a[:, 2] + r) ** 2))

    def take(self, x, y, r):
        if self._n == len(self._xyr):
            self._xyr = np.concatenate([self._xyr, np.zeros_like(self._xyr)])
        self._xyr[self._n] = (x, y, r)
        self._n += 1

    @staticmethod
    def _chain(x, y, yaw, length, width):
        """Circles covering a long footprint (a bus is 12 m by 2.5 m: one circle would claim a 13 m disc)."""
        r = width / 2 + 0.1
        n = max(1, int(np.ceil(length / (2 * r))))
        offsets = (np.arange(n) - (n - 1) / 2) * (length - 2 * r) / max(n - 1, 1)
        return [(x + np.cos(yaw) * o, y + np.sin(yaw) * o, r) for o in offsets]

    def free_long(self, x, y, yaw, length, width) -> bool:
        return all(self.free(*c) for c in self._chain(x, y, yaw, length, width))

    def take_long(self, x, y, yaw, length, width):
        for c in self._chain(x, y, yaw, length, width):
            self.take(*c)


def _footprint(parts: Primitives) -> tuple[float, float]:
    """(length, width) of an object's parts (object frame, x = heading)."""
    ext = parts_extent(parts, np.eye(3))
    lo, hi = (parts.center - ext).min(0), (parts.center + ext).max(0)
    return float(hi[0] - lo[0]), float(hi[1] - lo[1])


def _fitting_footprint(placer: _Placer, x: float, y: float, yaw: float, parts: Primitives) -> tuple | None:
    """A large vehicle's (length, width) where it still fits at its place (one longer than the 12.5 m the place
    was checked for is checked again), else None."""
    length, width = _footprint(parts)
    return (length, width) if length <= 12.6 or placer.free_long(x, y, yaw, length, width) else None


def _object_radius(parts: Primitives) -> float:
    ext = parts_extent(parts, np.eye(3))
    lo = (parts.center - ext).min(0)
    hi = (parts.center + ext).max(0)
    return float(np.hypot(max(abs(lo[0]), abs(hi[0])), max(abs(lo[1]), abs(hi[1]))))


def make_scene(seed: int = 0, mode: str = "street", *, n_cars: int | None = None, n_pedestrians: int | None = None,
               n_cyclists: int | None = None, clutter: float = 1.0, length: float = 150.0,
               moving: bool = True, ego_speed: float = 8.0, lookalikes: float = 0.0,
               ped_groups: float = 0.0, large_vehicles: float = 1.0, ped_context: float = 0.0,
               ped_by_cars: float = 0.0, ped_overhead: float = 0.0, shrubs: float = 0.0) -> Scene:
    """Build a reproducible scene.

    mode "street": a road along x with lanes, parked cars on both sides and moving traffic,
    sidewalks with curbs, pedestrians, cyclists, trees, poles, clutter and building facades.
    mode "open": objects scattered at random positions and headings on open ground with clutter.
    ``clutter`` scales the amount of background; ``length`` is how far the scene reaches along x.
    ``moving``: give traffic, pedestrians and cyclists velocities (used by simulate_drive);
    ``ego_speed``: speed of the traffic ahead in the ego lane (so a drive does not run into it).
    ``lookalikes``: density of person-sized non-pedestrians (sim/lookalikes.py; 0 = none, the original scenes).
    ``ped_groups``: share of pedestrians walking with one or two companions side by side or just behind
    (0 = none, the original scenes): two people 0.6-0.9 m apart must stay two pedestrians, not one cyclist.
    ``large_vehicles``: density of the trucks and buses driving in a street's lanes (1: 0-3 tried per 180 m of
    road; 0: only the parked ones).
    ``ped_context``: share of pedestrians given unlabelled surroundings within reach (a wall or fence along their
    path, a shrub, a pole; 0 = none, the original scenes, where every pedestrian stands clear of everything):
    the real pedestrians the detector misses stand against walls, in shrubs and beside poles.
    ``ped_by_cars``: share of parked cars given a pedestrian (labelled) at a door or at the boot, 0.15-0.6 m from
    the body (0 = none, the original scenes): others of the real misses stand beside a parked car.
    ``ped_overhead``: share of pedestrians given unlabelled structure overhead, its underside 2.2-3.5 m above their
    ground: a tree crown (its trunk 0.7-2.5 m away), an awning or arcade roof along a facade, a shelter roof on
    posts (0 = none, the original scenes, where nothing hangs over a pedestrian): every real AV2 pedestrian with
    >= 30 points has points within 1 m of it 0.3-4 m above its head, and sensors that see upwards (VLP-32C, the
    Livox models) see them; a column under a crown is what the detector learnt as a tree trunk.
    ``shrubs``: density of car-sized lumpy shrubs and hedge pieces (2-5.5 m long, 0.8-2.5 m high, unlabelled) on the
    roadside beyond the parked cars (1: about one per 12 m of road on each side; 0 = none, the original scenes): the
    real car false positives include a 2 m shrub by garages, roadside greenery and hedges on a slope.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if mode not in SCENE_MODES:
        raise ConfigError(f"unknown scene mode {mode!r}; choose one of {SCENE_MODES}")
    if clutter < 0 or length <= 0 or lookalikes < 0:
        raise ConfigError("clutter and lookalikes must be >= 0 and length > 0")
    if not 0.0 <= large_vehicles <= 10.0:
        raise ConfigError(f"large_vehicles must be in [0, 10], got {large_vehicles!r}")
    if not 0.0 <= ped_groups <= 1.0:
        raise ConfigError(f"ped_groups is a share in [0, 1], got {ped_groups!r}")
    if not 0.0 <= ped_context <= 1.0:
        raise ConfigError(f"ped_context is a share in [0, 1], got {ped_context!r}")
    if not 0.0 <= ped_by_cars <= 1.0:
        raise ConfigError(f"ped_by_cars is a share in [0, 1], got {ped_by_cars!r}")
    if not 0.0 <= ped_overhead <= 1.0:
        raise ConfigError(f"ped_overhead is a share in [0, 1], got {ped_overhead!r}")
    if not 0.0 <= shrubs <= 5.0:
        raise ConfigError(f"shrubs is a density in [0, 5], got {shrubs!r}")
    for name, v in (("n_cars", n_cars), ("n_pedestrians", n_pedestrians), ("n_cyclists", n_cyclists)):
        if v is not None and v < 0:
            raise ConfigError(f"{name} must be >= 0")
    rng = np.random.default_rng([int(seed), 1])
    if mode == "street":
        scn = _street(rng, seed, n_cars, n_pedestrians, n_cyclists, clutter, length, moving, ego_speed, lookalikes,
                      large_vehicles)
    else:
        scn = _open(rng, seed, n_cars, n_pedestrians, n_cyclists, clutter, length, moving, lookalikes)
    if ped_groups > 0:
        _add_companions(scn, np.random.default_rng([int(seed), 13]), ped_groups)
    if ped_by_cars > 0:  # before the context: walls and shrubs then keep clear of these pedestrians too
        _add_pedestrians_by_cars(scn, np.random.default_rng([int(seed), 23]), ped_by_cars)
    if ped_context > 0:
        _add_pedestrian_context(scn, np.random.default_rng([int(seed), 19]), ped_context)
    if ped_overhead > 0:  # own stream; its trunks, facades and posts keep clear of the objects, not of context walls
        _add_pedestrian_overhead(scn, np.random.default_rng([int(seed), 29]), ped_overhead)
    if shrubs > 0:  # own stream, last: keeps clear of every object and of the ego lane
        _add_roadside_shrubs(scn, np.random.default_rng([int(seed), 31]), shrubs)
    return scn


def _reaches_another(others: list, points, reach: float, own_id: int) -> bool:
    """Whether something of radius ``reach`` at any of ``points`` (x, y) comes within 0.1 m of one of ``others``
    ((x, y, radius, object_id) circles), the one with ``own_id`` aside."""
    return any(oid != own_id and np.hypot(p[0] - ox, p[1] - oy) < orad + reach + 0.1
               for p in points for ox, oy, orad, oid in others)


def _add_pedestrian_context(scn: Scene, rng: np.random.Generator, share: float) -> None:
    """Put unlabelled surroundings within 0.3-0.7 m of a ``share`` of the pedestrians: a wall, facade or fence
    parallel to their heading (3-10 m long, so a walking one stays beside it), or, for a standing one, a shrub
    or a pole. Nothing is placed where it would reach another object's footprint. Own random stream: the
    rest of the scene is unchanged."""
    others = [(ob.position[0], ob.position[1], _object_radius(ob.parts), ob.object_id) for ob in scn.objects]
    b = PrimitiveBuilder()
    for ob in [o for o in scn.objects if o.label == PEDESTRIAN]:
        if rng.random() >= share or (scn.mode == "street" and abs(np.cos(ob.yaw)) < 0.7):
            continue  # (not on one facing across a street, crossing or not: a wall along its heading would close the road)
        x, y, z0 = (float(v) for v in ob.position)
        fwd = np.array([np.cos(ob.yaw), np.sin(ob.yaw)])
        left = np.array([-fwd[1], fwd[0]])
        side = float(rng.choice((-1.0, 1.0)))
        moving = bool(np.any(ob.velocity != 0))
        u = 0.0 if moving else rng.random()
        gap = float(rng.uniform(0.3, 0.7))  # from the pedestrian's centre to the surface
        if u < 0.5:  # wall / facade (solid) or fence (partly transparent) along the path
            length, thick = float(rng.uniform(3.0, 10.0)), float(rng.uniform(0.05, 0.35))
            height = float(rng.uniform(1.0, 3.5))
            c = np.array([x, y]) + side * (gap + thick / 2) * left + float(rng.uniform(-0.3, 0.3)) * length * fwd
            probe = [c + t * fwd for t in np.linspace(-length / 2, length / 2, max(2, int(length / 0.5)))]
            reach = thick / 2
            fence = rng.random() < 0.35
            add = lambda: b.add(BOX, (c[0], c[1], z0 + height / 2), (length / 2, thick / 2, height / 2),
                                rot_z(ob.yaw), reflect=float(rng.uniform(0.08, 0.4)),
                                hit_prob=float(rng.uniform(0.3, 0.9)) if fence else 1.0)
        elif u < 0.8:  # shrub touching them
            r = float(rng.uniform(0.4, 1.1))
            ang = float(rng.uniform(0, 2 * np.pi))
            c = np.array([x, y]) + (gap + r) * np.array([np.cos(ang), np.sin(ang)])
            probe, reach = [c], r
            k = float(rng.uniform(2.0, 5.0))
            add = lambda: b.add(ELLIPSOID, (c[0], c[1], z0 + r * 0.6), (r, r * rng.uniform(0.7, 1.3), r * 0.7),
                                reflect=0.4, volume_k=k)
        else:  # pole / sign post
            h, pr = float(rng.uniform(2.5, 8.0)), float(rng.uniform(0.04, 0.15))
            ang = float(rng.uniform(0, 2 * np.pi))
            c = np.array([x, y]) + gap * np.array([np.cos(ang), np.sin(ang)])
            probe, reach = [c], pr
            add = lambda: b.add(CYLINDER, (c[0], c[1], z0 + h / 2), (pr, pr, h / 2),
                                reflect=float(rng.uniform(0.1, 0.35)))
        if _reaches_another(others, probe, reach, ob.object_id):
            continue
        add()
        others.append((float(c[0]), float(c[1]), reach, -1))
    scn.static = Primitives.concat([scn.static, b.build()])


def _add_roadside_shrubs(scn: Scene, rng: np.random.Generator, density: float) -> None:
    """Car-sized lumpy shrubs and hedge pieces (unlabelled): 3-7 foliage ellipsoids along a 2-5.5 m line, 0.8-2.5 m
    high, on each side of the road 1.5-7 m beyond the line the parked cars stand on (in an open scene: anywhere 5-60 m
    out), about ``density`` per 12 m of road and side. Each keeps 0.3 m clear of every object's footprint and 2.5 m
    of the ego lane. Own random stream: the rest of the scene is unchanged."""
    others = [(ob.position[0], ob.position[1], _object_radius(ob.parts), ob.object_id) for ob in scn.objects]
    b = PrimitiveBuilder()
    x_lo, x_hi = max(scn.extent_x[0], 3.0), scn.extent_x[1]
    n = int(round(density * (x_hi - x_lo) / 12.0))
    parked = [ob.position[1] - scn.ego_y for ob in scn.objects if ob.label == CAR and not np.any(ob.velocity != 0)]
    # per side: 1 m beyond the median line the parked cars stand on (None: no parked car on that side)
    kerb = {side: float(np.median(line)) + 1.0 if (line := [abs(d) for d in parked if d * side > 0]) else None
            for side in (-1.0, 1.0)}
    for _ in range(2 * n):
        side = float(rng.choice((-1.0, 1.0)))
        if scn.mode == "street":
            edge = kerb[side] if kerb[side] is not None else float(rng.uniform(5.0, 9.0))
            x, y = float(rng.uniform(x_lo, x_hi)), scn.ego_y + side * (edge + float(rng.uniform(1.5, 7.0)))
        else:
            r, a = float(rng.uniform(5.0, 60.0)), float(rng.uniform(-np.pi / 3, np.pi / 3))
            x, y = r * np.cos(a), r * np.sin(a)
        length, height = float(rng.uniform(2.0, 5.5)), float(rng.uniform(0.8, 2.5))
        yaw = float(rng.normal(0.0, 0.3)) if scn.mode == "street" else float(rng.uniform(0, np.pi))
        axis = np.array([np.cos(yaw), np.sin(yaw)])
        k = int(rng.integers(3, 8))
        along = np.sort(rng.uniform(-0.5, 0.5, k)) * length
        radii = rng.uniform(0.45, 1.0, k) * min(1.3, 0.5 * height + 0.3)
        centres = [np.array([x, y]) + t * axis + rng.normal(0.0, 0.15, 2) for t in along]
        if any(abs(c[1] - scn.ego_y) - r < 2.5 for c, r in zip(centres, radii)):
            continue
        if _reaches_another(others, centres, float(radii.max()) + 0.2, -1):
            continue
        for c, r in zip(centres, radii):
            z0 = float(scn.ground.height(c[0], c[1]))
            top = float(rng.uniform(0.6, 1.0)) * height
            b.add(ELLIPSOID, (c[0], c[1], z0 + top / 2), (r, r * float(rng.uniform(0.7, 1.2)), top / 2),
                  reflect=float(rng.uniform(0.25, 0.5)), volume_k=float(rng.uniform(2.0, 6.0)))
            others.append((float(c[0]), float(c[1]), float(r), -1))
    scn.static = Primitives.concat([scn.static, b.build()])


def _add_pedestrian_overhead(scn: Scene, rng: np.random.Generator, share: float) -> None:
    """Put unlabelled structure over a ``share`` of the pedestrians, its underside 2.2-3.5 m above their ground:
    a tree crown whose trunk stands 0.7-2.5 m away, an awning or arcade roof along a facade 0.4-3 m from them (not
    for one facing across a street: the facade would close the road), or a shelter roof on four thin posts with a
    glass back. What stands on the ground (trunk, facade, posts, panel) keeps clear of every object's footprint
    and of the static structure this function placed; what hangs overhead keeps clear of trucks and buses (the
    only objects reaching that high) and stays 2.5 m from the ego path (the sensor drives under nothing).
    Own random stream: the rest of the scene is unchanged."""
    others = [(ob.position[0], ob.position[1], _object_radius(ob.parts), ob.object_id) for ob in scn.objects]
    tall = [(ob.position[0], ob.position[1], _object_radius(ob.parts), ob.object_id) for ob in scn.objects
            if ob.label in (TRUCK, BUS)]
    overhead: list[tuple[float, float, float, int]] = []  # (x, y, radius, -1) of the crowns / roofs placed

    def clear_overhead(c, reach: float) -> bool:
        if abs(float(c[1]) - scn.ego_y) - reach < 2.5 or (scn.mode == "open" and np.hypot(c[0], c[1]) - reach < 3):
            return False
        return not _reaches_another(tall + overhead, [c], reach, -2)

    b = PrimitiveBuilder()
    for ob in [o for o in scn.objects if o.label == PEDESTRIAN]:
        if rng.random() >= share:
            continue
        p = np.asarray(ob.position[:2], float)
        z0 = float(ob.position[2])
        base = float(rng.uniform(2.2, 3.5))  # the structure's underside above the pedestrian's ground
        u = rng.random()
        if u < 0.5:  # a tree crown over them, its trunk beside them
            ang = float(rng.uniform(0, 2 * np.pi))
            dist = float(rng.uniform(0.7, 2.5))
            trunk = p + dist * np.array([np.cos(ang), np.sin(ang)])
            tr = float(rng.uniform(0.08, 0.25))
            centre = trunk + (p - trunk) * float(rng.uniform(0.0, 0.6))  # the crown leans over them
            rh = float(np.hypot(*(p - centre))) + float(rng.uniform(0.5, 2.0))
            rv = float(rng.uniform(0.6, 1.8))
            if _reaches_another(others, [trunk], tr, ob.object_id) or not clear_overhead(centre, rh):
                continue
            b.add(CYLINDER, (trunk[0], trunk[1], z0 + (base + 0.3) / 2), (tr, tr, (base + 0.3) / 2),
                  reflect=float(rng.uniform(0.15, 0.3)))
            b.add(ELLIPSOID, (centre[0], centre[1], z0 + base + rv), (rh, rh * float(rng.uniform(0.8, 1.1)), rv),
                  reflect=float(rng.uniform(0.25, 0.5)), volume_k=float(rng.uniform(0.6, 2.5)))
            others.append((float(trunk[0]), float(trunk[1]), tr, -1))
            overhead.append((float(centre[0]), float(centre[1]), rh, -1))
        elif u < 0.8:  # an awning / arcade roof / balcony along a facade behind them
            if scn.mode == "street" and abs(np.cos(ob.yaw)) < 0.7:
                continue
            fwd = np.array([np.cos(ob.yaw), np.sin(ob.yaw)])
            n = float(rng.choice((-1.0, 1.0))) * np.array([-fwd[1], fwd[0]])  # towards the facade
            depth, length = float(rng.uniform(1.5, 3.5)), float(rng.uniform(4.0, 12.0))
            gap = float(rng.uniform(0.4, min(3.0, depth - 0.3)))  # pedestrian centre -> facade
            shift = float(rng.uniform(-0.3, 0.3)) * length * fwd
            face = p + n * (gap + 0.15) + shift
            roof = p + n * (gap - depth / 2) + shift
            thick = float(rng.uniform(0.1, 0.5))
            probe = [face + t * fwd for t in np.linspace(-length / 2, length / 2, max(2, int(length / 0.5)))]
            roof_probe = [roof + t * fwd for t in np.linspace(-length / 2, length / 2, 5)]
            if _reaches_another(others, probe, 0.15, ob.object_id) or not all(
                    clear_overhead(q, depth / 2) for q in roof_probe):
                continue
            face_h = float(rng.uniform(base + 0.5, 8.0))
            b.add(BOX, (face[0], face[1], z0 + face_h / 2), (length / 2, 0.15, face_h / 2), rot_z(ob.yaw),
                  reflect=float(rng.uniform(0.08, 0.4)))
            b.add(BOX, (roof[0], roof[1], z0 + base + thick / 2), (length / 2, depth / 2, thick / 2), rot_z(ob.yaw),
                  reflect=float(rng.uniform(0.1, 0.5)), hit_prob=1.0 if rng.random() < 0.8 else 0.5)
            others.extend((float(q[0]), float(q[1]), 0.15, -1) for q in probe)
            overhead.extend((float(q[0]), float(q[1]), depth / 2, -1) for q in roof_probe)
        else:  # a shelter (bus stop) roof on four posts, a glass panel along one long side
            yaw = float(ob.yaw + rng.choice((0.0, np.pi / 2)) + rng.normal(0, 0.1))
            ax = np.array([np.cos(yaw), np.sin(yaw)])
            ay = np.array([-ax[1], ax[0]])
            hl, hw = float(rng.uniform(1.25, 2.5)), float(rng.uniform(0.6, 1.0))
            centre = p - float(rng.uniform(-1, 1)) * (hl - 0.4) * ax - float(rng.uniform(-1, 1)) * (hw - 0.5) * ay
            posts = [centre + sx * (hl - 0.05) * ax + sy * (hw - 0.05) * ay for sx in (-1, 1) for sy in (-1, 1)]
            if (_reaches_another(others, posts, 0.06, ob.object_id) or min(np.hypot(*(q - p)) for q in posts) < 0.4
                    or not clear_overhead(centre, float(np.hypot(hl, hw)))):
                continue
            roof_z = z0 + base
            for q in posts:
                b.add(CYLINDER, (q[0], q[1], z0 + base / 2), (0.05, 0.05, base / 2), reflect=0.3)
            b.add(BOX, (centre[0], centre[1], roof_z + 0.06), (hl, hw, 0.06), rot_z(yaw),
                  reflect=float(rng.uniform(0.15, 0.4)))
            back = centre + float(rng.choice((-1.0, 1.0))) * (hw - 0.05) * ay
            b.add(BOX, (back[0], back[1], z0 + 0.2 + (base - 0.3) / 2), (hl - 0.1, 0.02, (base - 0.3) / 2),
                  rot_z(yaw), reflect=0.1, hit_prob=float(rng.uniform(0.2, 0.5)))
            others.extend((float(q[0]), float(q[1]), 0.06, -1) for q in posts)
            overhead.append((float(centre[0]), float(centre[1]), float(np.hypot(hl, hw)), -1))
    scn.static = Primitives.concat([scn.static, b.build()])


def _add_pedestrians_by_cars(scn: Scene, rng: np.random.Generator, share: float) -> None:
    """Give a ``share`` of the parked cars a pedestrian (labelled) 0.15-0.6 m from the body: at a door (facing
    the car, away from it, or along it) or at the boot; most stand, some walk slowly along the car. Left out where
    its body would come within reach of another object. Own random stream: the rest of the scene is unchanged."""
    placed = [(ob.position[0], ob.position[1], _object_radius(ob.parts), ob.object_id) for ob in scn.objects]
    next_id = max((ob.object_id for ob in scn.objects), default=-1) + 1
    body = 0.25  # a pedestrian's half-width: the gap is measured from the car's body to the person's surface
    for car in [o for o in scn.objects if o.label == CAR and not np.any(o.velocity != 0)]:
        if rng.random() >= share:
            continue
        length, width = _footprint(car.parts)
        fwd = np.array([np.cos(car.yaw), np.sin(car.yaw)])
        left = np.array([-fwd[1], fwd[0]])
        gap = float(rng.uniform(0.15, 0.6))
        if rng.random() < 0.75:  # at a door, either side
            side = float(rng.choice((-1.0, 1.0)))
            off = float(rng.uniform(-0.35, 0.35)) * length * fwd + side * (width / 2 + gap + body) * left
            facing = float(rng.choice((0.0, np.pi, np.pi / 2, -np.pi / 2)))  # along the car, or to / from it
        else:  # at the boot
            off = -(length / 2 + gap + body) * fwd + float(rng.uniform(-0.3, 0.3)) * width * left
            facing = float(rng.choice((np.pi / 2, -np.pi / 2, 0.0)))  # along the bumper, or facing the boot
        x, y = car.position[0] + off[0], car.position[1] + off[1]
        if _reaches_another(placed, [(x, y)], body, car.object_id):
            continue
        parts = build_pedestrian(rng)
        yaw = float(car.yaw + facing + rng.normal(0, 0.2))
        vel = np.zeros(2)
        if rng.random() < 0.3 and abs(np.sin(facing)) < 0.5:  # walking past along the car
            vel = float(rng.uniform(0.5, 1.3)) * np.array([np.cos(yaw), np.sin(yaw)])
        z = float(scn.ground.height(x, y))
        scn.objects.append(SceneObject(PEDESTRIAN, parts, np.array([x, y, z]), yaw, vel, next_id))
        placed.append((x, y, _object_radius(parts), next_id))
        next_id += 1


def _add_companions(scn: Scene, rng: np.random.Generator, share: float) -> None:
    """Give a ``share`` of the scene's pedestrians one or two companions walking beside them (0.6-0.9 m
    apart, shoulder to shoulder) or just behind, same heading and speed; a companion is left out where it
    would overlap another object's footprint. Uses its own random stream: the rest of the scene is unchanged."""
    placed = [(ob.position[0], ob.position[1], _object_radius(ob.parts)) for ob in scn.objects]
    next_id = max((ob.object_id for ob in scn.objects), default=-1) + 1
    for ob in [o for o in scn.objects if o.label == PEDESTRIAN]:
        if rng.random() >= share:
            continue
        fwd = np.array([np.cos(ob.yaw), np.sin(ob.yaw)])
        left = np.array([-fwd[1], fwd[0]])
        n_companions = 1 if rng.random() < 0.7 else 2
        first_side = float(rng.choice((-1.0, 1.0)))
        for side in (first_side, -first_side)[:n_companions]:  # a third walks on the leader's other side
            if rng.random() < 0.75:  # beside
                off = side * rng.uniform(0.6, 0.9) * left + rng.uniform(-0.3, 0.3) * fwd
            else:  # just behind
                off = -rng.uniform(0.9, 1.4) * fwd + rng.uniform(-0.3, 0.3) * left
            x, y = ob.position[0] + off[0], ob.position[1] + off[1]
            parts = build_pedestrian(rng)
            r = _object_radius(parts)
            # people in a group stand closer than the placement radii allow: only their bodies must not overlap
            if any(np.hypot(x - px, y - py) < (0.55 if pr < 0.6 else pr + 0.35) for px, py, pr in placed):
                continue
            yaw = float(ob.yaw + rng.normal(0, 0.15))
            scn.objects.append(SceneObject(PEDESTRIAN, parts, np.array([x, y, ob.position[2]]), yaw,
                                           np.array(ob.velocity, float), next_id))
            placed.append((x, y, r))
            next_id += 1


def _street(rng, seed, n_cars, n_peds, n_cyc, clutter, length, moving, ego_speed, lookalikes=0.0,
            large_vehicles=1.0) -> Scene:
    lanes_each = int(_pick(rng, (1, 2), (0.6, 0.4)))
    lane_w = 3.4
    park_w = 2.3 if rng.random() < 0.85 else 0.0
    road_half = lanes_each * lane_w + park_w
    ground = _ground(rng, "street", road_half)
    tilt = ground.tilt()
    ego_y = -(int(rng.integers(0, lanes_each)) + 0.5) * lane_w
    x_lo, x_hi = -30.0, float(length)
    b = PrimitiveBuilder()
    placer = _Placer()
    objects: list[SceneObject] = []
    curb_h = float(rng.uniform(0.1, 0.18))
    walk_w = [float(rng.uniform(2.0, 5.0)), float(rng.uniform(2.0, 5.0))]  # right (-y), left (+y)
    # cross streets: x-intervals without buildings
    cross = []
    xs = list(rng.uniform(15, x_hi, int(rng.integers(0, 3))))
    if rng.random() < 0.6:  # an intersection close ahead opens the view sideways (as in the real scans)
        xs.append(float(rng.uniform(12, 45)))
    for xc in xs:
        cross.append((xc - rng.uniform(5, 9), xc + rng.uniform(5, 9)))

    def in_cross(x):
        return any(a <= x <= b_ for a, b_ in cross)

    # sidewalks (tilted with the ground plane), interrupted at cross streets
    for side, ww in ((-1, walk_w[0]), (1, walk_w[1])):
        edges = [x_lo] + [v for iv in sorted(cross) for v in iv] + [x_hi]
        for a, c in zip(edges[0::2], edges[1::2]):
            if c - a < 1:
                continue
            yc = side * (road_half + ww / 2)
            xc = (a + c) / 2
            zc = ground.plane(xc, yc) + curb_h / 2 - 0.1
            b.add(BOX, (xc, yc, zc), ((c - a) / 2, ww / 2, curb_h / 2 + 0.1), tilt,
                  reflect=float(rng.uniform(0.18, 0.35)))
    # building facades (with gaps; some streets are lined, others open onto yards, lots and parks)
    facade_density = float(rng.uniform(0.25, 0.95))
    for side, ww in ((-1, walk_w[0]), (1, walk_w[1])):
        x = x_lo
        while x < x_hi:
            w = float(rng.uniform(8, 40))
            if rng.random() < facade_density * min(clutter, 1.2) and not in_cross(x) and not in_cross(x + w):
                setback = float(rng.uniform(0, 12)) if rng.random() < 0.5 else 0.0
                y_face = side * (road_half + ww + setback)
                _add_building(b, rng, x, x + w, y_face, side, ground.plane(x + w / 2, y_face))
                # a fence or hedge in front of setback buildings
                if setback > 1.5 and rng.random() < 0.5:
                    yf = side * (road_half + ww + 0.3)
                    if rng.random() < 0.5:
                        b.add(BOX, (x + w / 2, yf, ground.plane(x, yf) + 0.6 + curb_h), (w / 2, 0.4, 0.6),
                              reflect=0.4, volume_k=3.0)
                    else:
                        b.add(BOX, (x + w / 2, yf, ground.plane(x, yf) + 0.6 + curb_h), (w / 2, 0.03, 0.6),
                              reflect=0.35, hit_prob=0.5)
            x += w + float(rng.uniform(0, 6))
    _add_background(b, rng, ground, x_lo, x_hi, road_half + max(walk_w) + 3.0, clutter)
    _add_skyline(b, rng, ground, x_hi, x_hi + 40.0, x_hi * 0.8, clutter)
    # trees and poles along the curbs
    for side, ww in ((-1, walk_w[0]), (1, walk_w[1])):
        x = x_lo + rng.uniform(0, 10)
        while x < x_hi:
            y = side * (road_half + rng.uniform(0.4, 1.0))
            z0 = ground.plane(x, y) + curb_h
            if not in_cross(x) and placer.free(x, y, 0.5):
                if rng.random() < 0.5:
                    _add_tree(b, rng, x, y, z0)
                else:
                    _add_pole(b, rng, x, y, z0, 0.0 if rng.random() < 0.5 else np.pi)
                placer.take(x, y, 0.5)
            x += float(rng.uniform(6, 25)) / max(clutter, 0.2)
    # sidewalk clutter
    scale = max(1.0, (x_hi - x_lo) / 180.0)  # long drives: same density along the road
    n_clutter = int(rng.integers(10, 30) * clutter * scale)
    for _ in range(n_clutter):
        side = _sign(rng)
        ww = walk_w[0] if side < 0 else walk_w[1]
        x = float(rng.uniform(x_lo + 5, x_hi))
        y = side * (road_half + rng.uniform(0.5, ww))
        if placer.free(x, y, 0.8) and not in_cross(x):
            _add_clutter(b, rng, x, y, ground.plane(x, y) + curb_h, float(rng.uniform(0, 2 * np.pi)))
            placer.take(x, y, 0.8)
    if lookalikes > 0:
        def walk_site(g):
            side = _sign(g)
            x, y = float(g.uniform(x_lo + 5, x_hi)), side * (road_half + g.uniform(0.3, walk_w[side > 0] - 0.2))
            return None if in_cross(x) else (x, y, float(ground.plane(x, y)) + curb_h)

        add_lookalikes(b, np.random.default_rng([int(seed), 11]), int(20 * lookalikes * scale), walk_site,
                       placer.free, placer.take)

    oid = 0

    def add_object(label, x, y, yaw, vel, on_walk):
        nonlocal oid
        # cheap check with the largest footprint of the class before building the parts
        if not placer.free(x, y, MAX_RADIUS[label]):
            return False
        parts = BUILDERS[label](rng)
        r = _object_radius(parts)
        # on the road: the detailed surface (crown); sidewalks are flat slabs over the plane
        z = ground.plane(x, y) + curb_h if on_walk else float(ground.height(x, y))
        objects.append(SceneObject(label, parts, np.array([x, y, z]), float(yaw), np.asarray(vel, float), oid))
        placer.take(x, y, r)
        oid += 1
        return True

    # keep the ego's own footprint free
    placer.take(0.0, ego_y, 3.0)
    # a few parked trucks / buses at the kerb
    for _ in range(int(rng.integers(0, 3))):
        side = _sign(rng)
        x = float(rng.uniform(x_lo + 15, x_hi))
        y = side * (road_half - 1.3)
        yaw = 0.0 if side < 0 else np.pi
        if not in_cross(x) and placer.free_long(x, y, yaw, 12.5, 2.55):
            label, parts = build_large_vehicle(rng)
            footprint = _fitting_footprint(placer, x, y, yaw, parts)
            if footprint is None:
                continue
            objects.append(SceneObject(label, parts, np.array([x, y, float(ground.height(x, y))]), yaw, np.zeros(2),
                                       oid))
            placer.take_long(x, y, yaw, *footprint)
            oid += 1
    # trucks and buses in the lanes, from their own random stream (placed before the cars: placed after them,
    # a 12 m vehicle rarely found a gap)
    g = np.random.default_rng([int(seed), 17])
    for _ in range(int(g.integers(0, 4) * scale * large_vehicles)):
        lane, side = int(g.integers(0, lanes_each)), _sign(g)
        y = side * (lane + 0.5) * lane_w + float(g.normal(0, 0.15))
        x = float(g.uniform(x_lo + 12, x_hi))
        yaw = (0.0 if side < 0 else np.pi) + float(g.normal(0, 0.02))
        if not placer.free_long(x, y, yaw, 12.5, 2.55):
            continue
        speed = float(g.uniform(3, 12)) if moving else 0.0
        if abs(y - ego_y) < lane_w / 2 and x > 0:
            speed = float(ego_speed) if moving else 0.0  # same lane ahead: keeps its gap to the ego
        label, parts = build_large_vehicle(g)
        footprint = _fitting_footprint(placer, x, y, yaw, parts)
        if footprint is None:
            continue
        objects.append(SceneObject(label, parts, np.array([x, y, float(ground.height(x, y))]), yaw,
                                   speed * np.array([np.cos(yaw), np.sin(yaw)]), oid))
        placer.take_long(x, y, yaw, *footprint)
        oid += 1
    # parked cars
    target_cars = n_cars if n_cars is not None else int(rng.integers(8, 30) * scale)
    n_parked = int(round(target_cars * (0.65 if park_w > 0 else 0.2)))
    n_moving_cars = target_cars - n_parked
    tries = 0
    while n_parked > 0 and tries < 400 * scale:
        tries += 1
        side = _sign(rng)
        x = float(rng.uniform(x_lo + 10, x_hi))
        if park_w > 0:
            y = side * (road_half - park_w / 2 + rng.uniform(-0.15, 0.15))
            on_walk = False
        else:  # parked half on the sidewalk
            y = side * (road_half + 0.6)
            on_walk = True
        if in_cross(x):
            continue
        yaw = (0.0 if side < 0 else np.pi) if rng.random() < 0.85 else float(rng.uniform(0, 2 * np.pi))
        yaw += float(rng.normal(0, 0.04))
        if add_object(CAR, x, y, yaw, (0, 0), on_walk):
            n_parked -= 1
    # moving cars in lanes (right-hand traffic: +x on the right half, -x on the left)
    tries = 0
    while n_moving_cars > 0 and tries < 400 * scale:
        tries += 1
        lane = int(rng.integers(0, lanes_each))
        side = _sign(rng)
        y = side * (lane + 0.5) * lane_w + float(rng.normal(0, 0.2))
        x = float(rng.uniform(x_lo + 8, x_hi))
        yaw = (0.0 if side < 0 else np.pi) + float(rng.normal(0, 0.02))
        speed = float(rng.uniform(3, 14)) if moving else 0.0
        if abs(y - ego_y) < lane_w / 2 and x > 0:
            speed = float(ego_speed) if moving else 0.0  # same lane ahead: keeps its gap to the ego
        vel = speed * np.array([np.cos(yaw), np.sin(yaw)])
        if add_object(CAR, x, y, yaw, vel, False):
            n_moving_cars -= 1
    # pedestrians on sidewalks (some crossing)
    n_p = n_peds if n_peds is not None else int(rng.integers(3, 15) * scale)
    tries = 0
    while n_p > 0 and tries < 400 * scale:
        tries += 1
        crossing = rng.random() < 0.12
        x = float(rng.uniform(x_lo + 5, x_hi * 0.8))
        if crossing:
            y = float(rng.uniform(-road_half, road_half))
            yaw = np.pi / 2 * _sign(rng) + float(rng.normal(0, 0.2))
            on_walk = False
        else:
            side = _sign(rng)
            ww = walk_w[0] if side < 0 else walk_w[1]
            y = side * (road_half + rng.uniform(0.3, ww))
            yaw = float((0.0 if rng.random() < 0.5 else np.pi) + rng.normal(0, 0.3)) if rng.random() < 0.75 else float(rng.uniform(0, 2 * np.pi))
            on_walk = True
        if abs(y - ego_y) < 2.5 and abs(x) < 10:
            continue
        speed = float(rng.uniform(0.8, 1.8)) if (moving and rng.random() < 0.7) else 0.0
        vel = speed * np.array([np.cos(yaw), np.sin(yaw)])
        if add_object(PEDESTRIAN, x, y, yaw, vel, on_walk):
            n_p -= 1
    # cyclists near the right road edge (and some on the left, against our direction)
    n_c = n_cyc if n_cyc is not None else int(rng.integers(1, 6) * scale)
    tries = 0
    while n_c > 0 and tries < 400 * scale:
        tries += 1
        side = _sign(rng)
        y = side * (road_half - park_w - rng.uniform(0.5, 1.2)) if park_w > 0 else side * (road_half - rng.uniform(0.6, 1.5))
        x = float(rng.uniform(x_lo + 8, x_hi * 0.8))
        yaw = (0.0 if side < 0 else np.pi) + float(rng.normal(0, 0.05))
        if rng.random() < 0.15:  # parked/walking bicycle on the sidewalk or odd heading
            yaw = float(rng.uniform(0, 2 * np.pi))
        speed = float(rng.uniform(3, 7)) if moving else 0.0
        vel = speed * np.array([np.cos(yaw), np.sin(yaw)])
        if abs(y - ego_y) < 1.5 and x > -5:
            continue
        if add_object(CYCLIST, x, y, yaw, vel, False):
            n_c -= 1
    _follow_in_lanes(objects, lane_w, lanes_each * lane_w)
    return Scene("street", int(seed), ground, b.build(), objects, ego_y, tilt, (x_lo, x_hi))


FOLLOW_HORIZON_S = 10.0  # a vehicle that would reach the one ahead in its lane within this time follows it
FOLLOW_GAP_M = 2.0  # the least bumper-to-bumper gap kept in a lane


def _follow_in_lanes(objects: list[SceneObject], lane_w: float, lanes_half: float) -> None:
    """Vehicles in one lane do not drive through each other: one that would close to within FOLLOW_GAP_M of the
    vehicle ahead (moving or standing in the lane) within FOLLOW_HORIZON_S drives at its speed instead (a platoon,
    or a queue behind a standing one). Front to back, so a chain slows together. Positions at t = 0 and every
    random draw are unchanged: only followers' speeds drop. Parked vehicles (beyond ``lanes_half``) are not in a
    lane."""
    in_lanes = [o for o in objects if o.label in (CAR, TRUCK, BUS) and abs(o.position[1]) < lanes_half]
    lengths = {id(o): _footprint(o.parts)[0] for o in in_lanes}
    for sign in (1.0, -1.0):  # +x traffic, then -x traffic
        lane = [o for o in in_lanes if np.cos(o.yaw) * sign > 0.9]
        lane.sort(key=lambda o: -sign * o.position[0])  # the front vehicle first
        for i, o in enumerate(lane):
            ahead = [a for a in lane[:i] if abs(a.position[1] - o.position[1]) < lane_w / 2]
            if not ahead:
                continue
            lead = min(ahead, key=lambda a: sign * (a.position[0] - o.position[0]))
            v_o, v_lead = float(np.linalg.norm(o.velocity)), float(np.linalg.norm(lead.velocity))
            gap = sign * (lead.position[0] - o.position[0]) - (lengths[id(o)] + lengths[id(lead)]) / 2 - FOLLOW_GAP_M
            if v_o > v_lead and gap < (v_o - v_lead) * FOLLOW_HORIZON_S:
                o.velocity = o.velocity * (v_lead / v_o)


def _open(rng, seed, n_cars, n_peds, n_cyc, clutter, length, moving, lookalikes=0.0) -> Scene:
    ground = _ground(rng, "open", 0.0)
    tilt = ground.tilt()
    b = PrimitiveBuilder()
    placer = _Placer()
    placer.take(0.0, 0.0, 2.5)
    objects: list[SceneObject] = []
    reach = float(min(length, 90.0))

    def sample_xy(r_min=3.0, r_max=reach, half_angle=np.radians(60)):
        # uniform in range (more near objects than area-uniform, as in driving data)
        r = rng.uniform(r_min, r_max)
        a = rng.uniform(-half_angle, half_angle)
        return r * np.cos(a), r * np.sin(a)

    # background: buildings far out, walls, trees, poles, clutter
    for _ in range(int(rng.integers(2, 8) * clutter)):
        x, y = sample_xy(20, reach + 20, np.radians(75))
        yaw = float(rng.uniform(0, np.pi))
        ln, dp, h = rng.uniform(6, 30), rng.uniform(5, 15), rng.uniform(3, 15)
        if placer.free(x, y, np.hypot(ln, dp) / 2):
            b.add(BOX, (x, y, ground.plane(x, y) + h / 2 - 0.5), (ln / 2, dp / 2, h / 2 + 0.5), rot_z(yaw),
                  reflect=float(rng.uniform(0.08, 0.3)))
            placer.take(x, y, np.hypot(ln, dp) / 2)
    for _ in range(int(rng.integers(2, 8) * clutter)):  # walls / fences
        x, y = sample_xy(12, reach)
        yaw = float(rng.uniform(0, np.pi))
        ln, h = rng.uniform(3, 20), rng.uniform(0.6, 2.5)
        if placer.free(x, y, ln / 2):
            b.add(BOX, (x, y, ground.plane(x, y) + h / 2), (ln / 2, 0.1, h / 2), rot_z(yaw),
                  reflect=float(rng.uniform(0.08, 0.35)), hit_prob=1.0 if rng.random() < 0.6 else 0.5)
            placer.take(x, y, ln / 2)
    _add_background(b, rng, ground, 10.0, reach + 40, 15.0, clutter)
    far = float(rng.uniform(60, 130))
    _add_skyline(b, rng, ground, far, far + 30.0, far * 1.2, clutter)
    # raised islands / sidewalk slabs with curbs (objects and clutter may stand on them)
    islands: list[tuple[float, float, float, float, float, float, float]] = []
    for _ in range(int(rng.integers(0, 5) * min(clutter, 1.5))):
        x, y = sample_xy(6, reach)
        yaw = float(rng.uniform(0, np.pi))
        hl, hw, top = float(rng.uniform(3, 25)), float(rng.uniform(0.5, 5)), float(rng.uniform(0.1, 0.2))
        c, s_ = np.cos(yaw), np.sin(yaw)
        # keep the sensor off the slab: distance from the origin to the rectangle
        lx, ly = abs(-x * c - y * s_), abs(x * s_ - y * c)
        if np.hypot(max(lx - hl, 0.0), max(ly - hw, 0.0)) < 3.0:
            continue
        b.add(BOX, (x, y, ground.plane(x, y) + top / 2 - 0.1), (hl, hw, top / 2 + 0.1), tilt @ rot_z(yaw),
              reflect=float(rng.uniform(0.18, 0.35)))
        islands.append((x, y, c, s_, hl, hw, top))

    def base_z(x: float, y: float) -> float:
        for cx, cy, c, s_, hl, hw, top in islands:
            dx, dy = x - cx, y - cy
            if abs(dx * c + dy * s_) <= hl and abs(-dx * s_ + dy * c) <= hw:
                return float(ground.plane(x, y)) + top
        return float(ground.height(x, y))

    for _ in range(int(rng.integers(5, 25) * clutter)):
        x, y = sample_xy(4, reach)
        if placer.free(x, y, 0.6):
            u = rng.random()
            z0 = base_z(x, y)
            if u < 0.35:
                if np.hypot(x, y) > 8.0:  # crowns reach 4 m out: keep them off the sensor
                    _add_tree(b, rng, x, y, z0)
            elif u < 0.6:
                _add_pole(b, rng, x, y, z0, float(rng.uniform(0, 2 * np.pi)))
            else:
                _add_clutter(b, rng, x, y, z0, float(rng.uniform(0, 2 * np.pi)))
            placer.take(x, y, 0.6)
    if lookalikes > 0:
        def open_site(g):
            r, a = g.uniform(4, reach * 0.7), g.uniform(-np.radians(60), np.radians(60))
            x, y = float(r * np.cos(a)), float(r * np.sin(a))
            return x, y, base_z(x, y)

        add_lookalikes(b, np.random.default_rng([int(seed), 11]), int(15 * lookalikes), open_site, placer.free,
                       placer.take)

    large = []  # trucks / buses standing about (labelled; listed after the other objects)
    for _ in range(int(rng.integers(0, 3))):
        x, y = sample_xy(15, reach)
        if placer.free(x, y, 6.5):
            yaw = float(rng.uniform(-np.pi, np.pi))
            label, parts = build_large_vehicle(rng)
            footprint = _fitting_footprint(placer, x, y, yaw, parts)
            if footprint is None:
                continue
            large.append((label, parts, x, y, yaw))
            placer.take_long(x, y, yaw, *footprint)

    counts = {
        CAR: n_cars if n_cars is not None else int(rng.integers(6, 20)),
        PEDESTRIAN: n_peds if n_peds is not None else int(rng.integers(4, 14)),
        CYCLIST: n_cyc if n_cyc is not None else int(rng.integers(2, 8)),
    }
    speeds = {CAR: (2, 12), PEDESTRIAN: (0.6, 1.8), CYCLIST: (2, 7)}
    oid = 0
    for label, n in counts.items():
        tries = 0
        while n > 0 and tries < 300:
            tries += 1
            parts = BUILDERS[label](rng)
            r_min = 5.0 if label == CAR else 3.5
            x, y = sample_xy(r_min, reach * (1.0 if label == CAR else 0.7))
            if rng.random() < 0.3 and objects:  # groups: near an existing object (occlusion, crowds)
                ref = objects[int(rng.integers(0, len(objects)))].position
                x, y = ref[0] + rng.normal(0, 3), ref[1] + rng.normal(0, 3)
                if np.hypot(x, y) < r_min:
                    continue
            r = _object_radius(parts)
            if not placer.free(x, y, r):
                continue
            yaw = float(rng.uniform(-np.pi, np.pi))
            sp = float(rng.uniform(*speeds[label])) if (moving and rng.random() < 0.5) else 0.0
            objects.append(SceneObject(label, parts, np.array([x, y, base_z(x, y)]), yaw,
                                       sp * np.array([np.cos(yaw), np.sin(yaw)]), oid))
            placer.take(x, y, r)
            oid += 1
            n -= 1
    for label, parts, x, y, yaw in large:
        objects.append(SceneObject(label, parts, np.array([x, y, float(ground.height(x, y))]), yaw, np.zeros(2), oid))
        oid += 1
    return Scene("open", int(seed), ground, b.build(), objects, 0.0, tilt, (-20.0, reach + 30))
