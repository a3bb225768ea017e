"""Stage 2: refine the detector's best candidates with the raw points inside them (PointNet on each RoI).

The BEV network sees the cloud through 0.4 m cells (lite); what tells a pedestrian from a bin or a
post, or where exactly a car ends, is finer than that. For each of the ``rois`` highest-heat
candidates of `topk_decode` the refiner takes up to ``points`` lidar points inside the candidate box
enlarged by ``margin`` (metres, every side, also above and below), in the box's own frame, runs a
small shared MLP over them, max-pools, adds what stage 1 knew (class, score, size, where the sensor
is), optionally what the rays say around it (``visibility``: see `first_hit_map`), and predicts

- the BEV IoU of the candidate with its object of the same class (a logit; 0 for background), which
  re-scores the candidate: score = stage-1 score^(1 - a) * IoU^a, ``a`` = ``score_alpha`` per class;
- a box residual (centre shift in box lengths/widths/heights, log size ratios, yaw change), applied
  to the candidate.

With ``passes`` > 1 the refiner runs again on its own refined boxes (same stage-1 scores and labels):
the IoU it then predicts is the refined box's, not the candidate's, so the score matches the box that
is published. Candidates below the first ``rois`` are dropped. Shapes are fixed per RoI (``points`` samples,
padded, with a validity mask); the number of points in the cloud is not, so this stage runs eagerly
after the compiled network (a few ms on one CPU thread). Sampling is deterministic: among a box's
points the ones with the largest golden-ratio hash of their index are taken, so the same cloud
always gives the same result. Trained with the detector frozen: `livox-infer train --stage refine`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.detector.boxes import axis_angle, bev_iou

POINT_FEATURES = 7  # u, v, w normalised to the enlarged box, u, v, w in metres, intensity / full scale
MOVE_LIMIT = 1.0  # residual moves are clamped to one box length / width / height per refinement step
MAX_PREFILTER_CELLS = 1 << 22  # the coarse map of `_near_any_box` (1 m cells) never exceeds this
# at most this many points near the candidates are gathered (those with the largest sampling key): the gather
# costs rois x near points, so a pile of points on one spot must not make it unbounded; real scans stay
# below it (10 Hz Livox frames: ~24k points in all; 64-beam KITTI scans of real_dev: up to ~34k near points)
MAX_NEAR_POINTS = 1 << 16
LOG_RATIO_LIMIT = 1.0  # residual log size ratios are clamped: one refinement step changes a size by <= e
# a candidate is a positive for the box regression when it overlaps its object by this BEV IoU (per class
# name; others 0.3): cars need an overlap that refining can finish, small objects overlap less at all
REGRESSION_MIN_IOU = {"car": 0.5}
DEFAULT_REGRESSION_MIN_IOU = 0.3
# visibility context (`first_hit_map`, `roi_visibility`): rays binned by azimuth; an "obstacle" return is
# one between these heights above the ground (levelled frame), i.e. something a car body would block
VIS_AZIMUTH_BINS = 900  # 0.4 deg: ~0.3 m at 40 m
VIS_OBSTACLE_Z = (0.3, 2.0)
VIS_EXTEND = (1.0, 0.5)  # metres the sample grid reaches beyond the box along / across its axis
VIS_RANGE_SCALE = 2.0  # metres of (first hit - sample range) that map to +-1


@dataclass(frozen=True)
class RefineConfig:
    rois: int = 32  # candidates refined per frame (the rest are dropped); run time
    points: int = 64  # points sampled per candidate
    margin: float = 0.5  # metres added to every side of the candidate box
    point_channels: tuple[int, ...] = (32, 64, 128)
    hidden: tuple[int, ...] = (128, 64)
    score_alpha: tuple[float, ...] = (0.75, 0.75, 0.75)  # per class; run time
    passes: int = 1  # refiner applications at inference, each on the previous pass's boxes; run time
    visibility: tuple[int, int] | None = None  # (along, across) ray-visibility samples per RoI, None = off
    # per class: does stage 2 refine it? A class it was never trained on keeps stage 1's score and box; run time
    refined: tuple[bool, ...] = (True, True, True)

    def architecture(self) -> dict:
        """What the refiner's weights depend on (``rois``, ``score_alpha`` and ``passes`` do not). Without
        visibility the dict is what it was before the option existed, so older weights keep their hash."""
        return {"points": self.points, "margin": self.margin, "point_channels": list(self.point_channels),
                "hidden": list(self.hidden), **({"visibility": list(self.visibility)} if self.visibility else {})}

    @property
    def visibility_size(self) -> int:
        return 2 * self.visibility[0] * self.visibility[1] if self.visibility else 0


def context_size(num_classes: int, visibility_size: int = 0) -> int:
    # class one-hot, stage-1 score, log size, range / 50 and the sensor's direction (+ visibility samples)
    return num_classes + 1 + 3 + 3 + visibility_size


def _box_frame(points: torch.Tensor, boxes: torch.Tensor):
    """Coordinates (u along the box axis, v across, w up) of every point relative to every box: (R, N) each."""
    c, s = torch.cos(boxes[:, 6:7]), torch.sin(boxes[:, 6:7])
    dx = points[None, :, 0] - boxes[:, 0:1]
    dy = points[None, :, 1] - boxes[:, 1:2]
    return c * dx + s * dy, -s * dx + c * dy, points[None, :, 2] - boxes[:, 2:3]


class PointCells:
    """Which coarse BEV cell (``cell`` metres, on the lattice of multiples of ``cell``) each point of a cloud lies in:
    computed once per frame for every refinement pass's `_near_any_box` (the points do not change between passes,
    the boxes do). ``flat`` is None when the cloud spans more than MAX_PREFILTER_CELLS cells or is not finite."""

    def __init__(self, points: torch.Tensor, cell: float = 1.0) -> None:
        self.cell = cell
        self.flat: torch.Tensor | None = None
        if points.shape[0] == 0:
            return
        xy = points[:, :2]
        lo_hi = torch.stack([xy.amin(0), xy.amax(0)])
        if not bool(torch.isfinite(lo_hi).all()):
            return
        self.lo = torch.floor(lo_hi[0] / cell) * cell
        ij = torch.floor((xy - self.lo) / cell).long()
        self.size = ij.amax(0) + 1  # (2,) map width (x), height (y)
        if int(self.size[0]) * int(self.size[1]) <= MAX_PREFILTER_CELLS:
            self.flat = ij[:, 1] * self.size[0] + ij[:, 0]


def _box_squares(boxes: torch.Tensor, margin: float, lo: torch.Tensor, cell: float):
    """First and last cell (R, 2) of each box's enlarged bounding square on the lattice at ``lo``."""
    reach = torch.hypot(boxes[:, 3] / 2 + margin, boxes[:, 4] / 2 + margin)  # (R,) circumscribed radius
    first = torch.floor((boxes[:, :2] - reach[:, None] - lo) / cell).long()
    last = torch.floor((boxes[:, :2] + reach[:, None] - lo) / cell).long()
    return first, last


def _mark_squares(first: torch.Tensor, last: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """A (size_x * size_y,) bool map, True in every cell of the squares [first, last] (clipped to the map)."""
    first, last = first.clamp_min(0), torch.minimum(last, size - 1)
    occupied = torch.zeros(int(size[0] * size[1]), dtype=torch.bool, device=first.device)
    keep = (first <= last).all(dim=1)  # squares that reach into the map at all
    if not bool(keep.any()):
        return occupied
    first, last = first[keep], last[keep]
    span = int((last - first).max()) + 1
    offs = torch.arange(span, device=first.device)
    cx = first[:, 0:1] + offs  # (R, span)
    cy = first[:, 1:2] + offs
    ok = (cx <= last[:, 0:1])[:, None, :] & (cy <= last[:, 1:2])[:, :, None]  # (R, span_y, span_x)
    occupied[(cy[:, :, None] * size[0] + cx[:, None, :])[ok]] = True
    return occupied


def _near_any_box(points: torch.Tensor, boxes: torch.Tensor, margin: float, cell: float = 1.0,
                  cells: PointCells | None = None) -> torch.Tensor:
    """Indices of the points in any box's enlarged bounding square, via a coarse BEV occupancy map (linear in
    the number of points; most of a cloud is ground and background far from every candidate). ``cells``: the
    points' `PointCells` (same ``cell``), when several calls look at the same points."""
    if cells is not None and cells.flat is not None:
        first, last = _box_squares(boxes, margin, cells.lo, cells.cell)
        return _mark_squares(first, last, cells.size)[cells.flat].nonzero()[:, 0]
    reach = torch.hypot(boxes[:, 3] / 2 + margin, boxes[:, 4] / 2 + margin)
    lo = torch.floor(torch.stack([(boxes[:, 0] - reach).min(), (boxes[:, 1] - reach).min()]) / cell) * cell
    first, last = _box_squares(boxes, margin, lo, cell)
    size = last.max(dim=0).values + 1  # (2,) map width (x), height (y)
    if int(size[0]) * int(size[1]) > MAX_PREFILTER_CELLS:  # boxes spread absurdly far: no map, all points
        return torch.arange(points.shape[0], device=points.device)
    occupied = _mark_squares(first, last, size)
    ij = torch.floor((points[:, :2] - lo) / cell).long()
    inb = (ij >= 0).all(dim=1) & (ij < size).all(dim=1)
    hit = torch.zeros(points.shape[0], dtype=torch.bool, device=points.device)
    hit[inb] = occupied[ij[inb, 1] * size[0] + ij[inb, 0]]
    return hit.nonzero()[:, 0]


def _sampling_key(index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Deterministic pseudo-random key in [0, 1) of each point index (golden-ratio hash). The constant is a literal,
    not a module global: a saved compiled function guards a global float by its object id, which no restart keeps."""
    return torch.frac(index.to(torch.float64) * 0.6180339887498949).to(dtype)


def _cap_near(near: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """At most MAX_NEAR_POINTS of the indices ``near``: those with the largest sampling key, i.e. the points
    each box would prefer anyway (an even, deterministic thinning of every box's points)."""
    if near.shape[0] <= MAX_NEAR_POINTS:
        return near
    top = _sampling_key(near, dtype).topk(MAX_NEAR_POINTS).indices
    return near[top.sort().values]


# A stacked point this much older than the newest stamp is from an earlier frame (a Livox frame lasts 100 ms;
# the clouds of a rig, merged at one stamp, lie within a few ms of each other).
EARLIER_FRAME_AGE_S = 0.05


def stage2_points(levelled: torch.Tensor, ages, age_input: bool) -> torch.Tensor:
    """What stage 2 sees of a levelled cloud whose points are ``ages`` (numpy or tensor, seconds; None: a
    single frame) old: a stacked cloud's newest frame only (the refiner looks at where an object is now; older
    frames put moving objects where they were), and, for a model whose fourth column carries the age
    (``grid.age_channel_s``), that column zeroed, as for a model fed no intensity."""
    old = None if ages is None else torch.as_tensor(ages, device=levelled.device) >= EARLIER_FRAME_AGE_S
    if old is not None and bool(old.any()):
        levelled = levelled[~old]  # (a copy)
    elif age_input:
        levelled = levelled.clone()
    if age_input:
        levelled[:, 3] = 0.0
    return levelled


def roi_point_features(points: torch.Tensor, boxes: torch.Tensor, n_samples: int, margin: float,
                       intensity_scale: float, compiled_core=None, cells: PointCells | None = None,
                       near: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Points (N, 4) and candidate boxes (R, 7), both in the levelled frame -> features (R, S, 7) and a
    validity mask (R, S): up to S = ``n_samples`` points inside each box enlarged by ``margin``, invalid
    slots zero. ``compiled_core``: a compiled `sampled_features` (used when at least S points are near); ``cells``:
    the points' `PointCells`, when the same points are looked at again (each refinement pass); ``near``: the
    indices of the points near the boxes, when the caller has them already (`refine_candidates`)."""
    r = boxes.shape[0]
    feats = points.new_zeros((r, n_samples, POINT_FEATURES))
    valid = torch.zeros((r, n_samples), dtype=torch.bool, device=points.device)
    if r == 0 or points.shape[0] == 0:
        return feats, valid
    if near is None:  # indices into points: the same result as looking at every point, far less work
        near = _cap_near(_near_any_box(points, boxes, margin, cells=cells), points.dtype)
    points = points[near]
    n = points.shape[0]
    if n == 0:
        return feats, valid
    k = min(n_samples, n)
    core = sampled_features if compiled_core is None or n < n_samples else compiled_core
    f, ok = core(points, near, boxes, k, margin, intensity_scale)
    feats[:, :k] = f
    valid[:, :k] = ok
    return feats, valid


def sampled_features(points: torch.Tensor, near: torch.Tensor, boxes: torch.Tensor, k: int, margin: float,
                     intensity_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` <= len(points) sampled points of each box and their features (R, k, 7), validity (R, k): the
    part of `roi_point_features` that costs (R x N elementwise work and a top-k) and has no data-dependent shape,
    so torch.compile(dynamic=True) fuses it (`compile_refiner`). ``near``: the points' indices in the cloud."""
    u, v, w = _box_frame(points, boxes)
    half = boxes[:, 3:6] / 2 + margin  # (R, 3)
    inside = (u.abs() <= half[:, 0:1]) & (v.abs() <= half[:, 1:2]) & (w.abs() <= half[:, 2:3])
    # the sampling key belongs to the point's index in the whole cloud, so pre-selecting changes nothing
    key = _sampling_key(near, points.dtype)
    top, idx = torch.where(inside, key[None, :], torch.full_like(u, -1.0)).topk(k, dim=1)
    ok = top >= 0
    pu, pv, pw = u.gather(1, idx), v.gather(1, idx), w.gather(1, idx)
    f = torch.stack([pu / half[:, 0:1], pv / half[:, 1:2], pw / half[:, 2:3], pu, pv, pw,
                     (points[:, 3][idx] / intensity_scale).clamp(0.0, 1.0)], dim=-1)  # as the voxelizer clamps
    return f * ok[..., None], ok


def roi_context(scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(R, context_size) what stage 1 says about each candidate, and where the sensor (levelled frame:
    above the origin) is seen from it: the faces that can have points are the ones facing it."""
    rng = torch.hypot(boxes[:, 0], boxes[:, 1]).clamp_min(1e-3)
    c, s = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    to_sensor_u = (-c * boxes[:, 0] - s * boxes[:, 1]) / rng
    to_sensor_v = (s * boxes[:, 0] - c * boxes[:, 1]) / rng
    return torch.cat([F.one_hot(labels, num_classes).to(boxes.dtype), scores[:, None].to(boxes.dtype),
                      torch.log(boxes[:, 3:6].clamp_min(1e-3)), (rng / 50.0)[:, None],
                      to_sensor_u[:, None], to_sensor_v[:, None]], dim=1)


def _azimuth_bin(x: torch.Tensor, y: torch.Tensor, n_bins: int) -> torch.Tensor:
    b = torch.floor((torch.atan2(y, x) + torch.pi) * (n_bins / (2 * torch.pi))).long()
    return b.clamp(0, n_bins - 1)


def first_hit_map(points: torch.Tensor, n_bins: int = VIS_AZIMUTH_BINS,
                  heights: tuple[float, float] = VIS_OBSTACLE_Z) -> tuple[torch.Tensor, torch.Tensor]:
    """Per azimuth bin around the sensor (levelled frame, sensor above the origin): the horizontal range of
    the nearest return between ``heights`` above the ground (inf where there is none) and whether the bin
    saw any return at all (False: outside the field of view, or a hole in this frame's scan pattern).
    Returns (first_range (n_bins,), observed (n_bins,) bool)."""
    first = points.new_full((n_bins,), float("inf"))
    observed = torch.zeros(n_bins, dtype=torch.bool, device=points.device)
    if points.shape[0] == 0:
        return first, observed
    b = _azimuth_bin(points[:, 0], points[:, 1], n_bins)
    observed[b] = True
    obstacle = (points[:, 2] > heights[0]) & (points[:, 2] < heights[1])
    first.scatter_reduce_(0, b[obstacle], torch.hypot(points[obstacle, 0], points[obstacle, 1]), "amin")
    return first, observed


def roi_visibility(first: torch.Tensor, observed: torch.Tensor, boxes: torch.Tensor,
                   samples: tuple[int, int], extend: tuple[float, float] = VIS_EXTEND) -> torch.Tensor:
    """What the rays say about a grid of ``samples`` = (along, across) BEV points over each box (R, 7),
    reaching ``extend`` metres beyond it: (R, 2 * along * across) = per sample the signed distance
    (first hit in its direction - its own range) / `VIS_RANGE_SCALE`, clipped to [-1, 1] (positive: the
    rays passed it, so nothing stands there; negative: something nearer hides it; 0 where the direction
    saw nothing), then per sample whether its direction saw any return.

    Why: the points of a partly seen car do not say where its unseen end is, but the rays next to them
    do: past a real end they go on (free space), behind an occluder they stop short."""
    r = boxes.shape[0]
    nu, nv = samples
    if r == 0:
        return boxes.new_zeros((0, 2 * nu * nv))
    t_u = torch.linspace(-1.0, 1.0, nu, device=boxes.device, dtype=boxes.dtype)
    t_v = torch.linspace(-1.0, 1.0, nv, device=boxes.device, dtype=boxes.dtype)
    u = t_u[None, :, None] * (boxes[:, 3, None, None] / 2 + extend[0])  # (R, nu, 1)
    v = t_v[None, None, :] * (boxes[:, 4, None, None] / 2 + extend[1])  # (R, 1, nv)
    c, s = torch.cos(boxes[:, 6, None, None]), torch.sin(boxes[:, 6, None, None])
    x = boxes[:, 0, None, None] + c * u - s * v  # (R, nu, nv)
    y = boxes[:, 1, None, None] + s * u + c * v
    b = _azimuth_bin(x, y, first.shape[0])
    f, seen = first[b], observed[b]
    d = torch.where(torch.isfinite(f), (f - torch.hypot(x, y)) / VIS_RANGE_SCALE, torch.ones_like(x))
    d = torch.where(seen, d.clamp(-1.0, 1.0), torch.zeros_like(d))
    return torch.cat([d.reshape(r, -1), seen.to(boxes.dtype).reshape(r, -1)], dim=1)


def refiner_context(cfg: RefineConfig, num_classes: int, scores: torch.Tensor, labels: torch.Tensor,
                    boxes: torch.Tensor, hits: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The refiner's context input: `roi_context`, plus `roi_visibility` when the config asks for it
    (``hits`` = `first_hit_map` of the frame's levelled points)."""
    ctx = roi_context(scores, labels, boxes, num_classes)
    if not cfg.visibility:
        return ctx
    return torch.cat([ctx, roi_visibility(hits[0], hits[1], boxes, cfg.visibility).to(ctx.dtype)], dim=1)


class RoiRefiner(nn.Module):
    """PointNet over each candidate's points + stage-1 context -> (IoU logit (R,), residual (R, 7))."""

    def __init__(self, cfg: RefineConfig, num_classes: int) -> None:
        super().__init__()
        layers, prev = [], POINT_FEATURES
        for ch in cfg.point_channels:
            layers += [nn.Conv1d(prev, ch, 1, bias=False), nn.BatchNorm1d(ch), nn.ReLU(inplace=True)]
            prev = ch
        self.point_mlp = nn.Sequential(*layers)
        head, prev = [], prev + context_size(num_classes, cfg.visibility_size)
        for ch in cfg.hidden:
            head += [nn.Linear(prev, ch), nn.ReLU(inplace=True)]
            prev = ch
        self.head = nn.Sequential(*head)
        self.iou = nn.Linear(prev, 1)
        self.residual = nn.Linear(prev, 7)
        nn.init.zeros_(self.residual.weight)  # starts as "keep the candidate box"
        nn.init.zeros_(self.residual.bias)

    def forward(self, feats: torch.Tensor, valid: torch.Tensor, context: torch.Tensor):
        r, n_samples = feats.shape[:2]
        # the shared MLP as matrix products over all (R x S) points: the 1x1 Conv1d layers' weights, applied as
        # linear layers (oneDNN's convolution path cost ~1 ms per layer on these tiny shapes); BatchNorm1d takes
        # (N, C) with the same statistics as (R, C, S)
        h = feats.reshape(r * n_samples, feats.shape[2])
        for layer in self.point_mlp:
            h = F.linear(h, layer.weight[:, :, 0], layer.bias) if isinstance(layer, nn.Conv1d) else layer(h)
        h = h.reshape(r, n_samples, -1).masked_fill(~valid[:, :, None], float("-inf")).amax(dim=1)
        h = torch.where(valid.any(dim=1, keepdim=True), h, torch.zeros_like(h))  # a box without points: zeros
        z = self.head(torch.cat([h, context], dim=1))
        return self.iou(z)[:, 0], self.residual(z)


def apply_residuals(boxes: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """Candidate boxes (R, 7) moved by residuals (R, 7) [du/l, dv/w, dz/h, log l'/l, log w'/w, log h'/h, dyaw]."""
    # bounded: a move of more than one box length (or a turn past a right angle) is never a refinement,
    # and an unbounded one (a hostile point's feature) would carry the box, and every size derived from it, away
    residual = torch.nan_to_num(residual, nan=0.0, posinf=0.0, neginf=0.0)
    c, s = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    move = residual[:, 0:3].clamp(-MOVE_LIMIT, MOVE_LIMIT)
    du, dv = move[:, 0] * boxes[:, 3], move[:, 1] * boxes[:, 4]
    size = boxes[:, 3:6] * torch.exp(residual[:, 3:6].clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return torch.stack([boxes[:, 0] + c * du - s * dv, boxes[:, 1] + s * du + c * dv,
                        boxes[:, 2] + move[:, 2] * boxes[:, 5], size[:, 0], size[:, 1], size[:, 2],
                        boxes[:, 6] + residual[:, 6].clamp(-math.pi / 2, math.pi / 2)], dim=1)


def encode_residuals(boxes: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The residuals that take ``boxes`` (R, 7) to ``target`` (R, 7) (yaw as an axis: the change is in
    [-pi/2, pi/2)); `apply_residuals` inverts it."""
    c, s = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    dx, dy = target[:, 0] - boxes[:, 0], target[:, 1] - boxes[:, 1]
    return torch.stack([(c * dx + s * dy) / boxes[:, 3], (-s * dx + c * dy) / boxes[:, 4],
                        (target[:, 2] - boxes[:, 2]) / boxes[:, 5],
                        torch.log(target[:, 3] / boxes[:, 3]), torch.log(target[:, 4] / boxes[:, 4]),
                        torch.log(target[:, 5] / boxes[:, 5]), axis_angle(target[:, 6] - boxes[:, 6])], dim=1)


def match_candidates(boxes: torch.Tensor, labels: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor):
    """For each candidate the same-class GT box of highest BEV IoU: (IoU (R,), that box (R, 7)); IoU 0 and
    the candidate itself where no GT box of its class overlaps it."""
    iou = boxes.new_zeros(boxes.shape[0])
    matched = boxes.clone()
    if boxes.shape[0] and gt_boxes.shape[0]:
        pair = bev_iou(boxes.double(), gt_boxes.double()).to(boxes.dtype)
        pair = pair * (labels[:, None] == gt_labels[None, :]).to(pair.dtype)
        best, j = pair.max(dim=1)
        hit = best > 0
        iou = torch.where(hit, best, iou)
        matched[hit] = gt_boxes[j[hit]].to(boxes.dtype)
    return iou, matched


def refine_loss(iou_logit: torch.Tensor, residual: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                match_iou: torch.Tensor, matched: torch.Tensor, classes: tuple[str, ...], box_beta: float = 0.02):
    """Binary cross-entropy of the IoU logit against each candidate's IoU with its object (0 for
    background), plus smooth-L1 (``box_beta``) of the residual on the positives (`REGRESSION_MIN_IOU`).
    Returns the total and its parts as floats."""
    bce = F.binary_cross_entropy_with_logits(iou_logit, match_iou.clamp(0, 1))
    thr = boxes.new_tensor([REGRESSION_MIN_IOU.get(c, DEFAULT_REGRESSION_MIN_IOU) for c in classes])[labels]
    pos = match_iou >= thr
    if pos.any():
        target = encode_residuals(boxes[pos], matched[pos])
        reg = F.smooth_l1_loss(residual[pos], target, beta=box_beta, reduction="none").sum(dim=1).mean()
    else:
        reg = residual.sum() * 0.0
    total = bce + reg
    return total, {"refine_iou": float(bce.detach()), "refine_box": float(reg.detach())}


@torch.no_grad()
def refine_candidates(refiner: RoiRefiner, cfg: RefineConfig, num_classes: int, points: torch.Tensor,
                      scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, intensity_scale: float,
                      rois: int | None = None, passes: int | None = None, compiled=None,
                      cells: PointCells | None = None):
    """Stage 2 on one frame: the first ``rois`` candidates of `topk_decode` (highest heat first) -> their
    re-scored scores (R,), labels (R,), refined boxes (R, 7), all in the levelled frame; ``passes``
    refiner applications (default: the config's), each on the previous one's boxes. ``compiled``: a
    `CompiledRefiner` or a package's `PackageStage2` to run the costly parts with (fewer candidates than its fixed
    ``rois`` are filled up to them, so that its compiled shapes apply). Candidates of a class stage 2 does not refine (``cfg.refined``)
    take no RoI and come after the refined ones unchanged (stage 1's score and box). ``cells``: the `PointCells`
    of ``points`` when the caller has them (a second refiner on the same frame)."""
    through = None
    if not all(cfg.refined):
        refined = torch.tensor(cfg.refined, dtype=torch.bool, device=labels.device)[labels]
        through = (scores[~refined].float(), labels[~refined], boxes[~refined].float())
        scores, labels, boxes = scores[refined], labels[refined], boxes[refined]
    r = min(rois or cfg.rois, scores.shape[0])
    scores, labels, boxes = scores[:r].float(), labels[:r], boxes[:r].float()
    if compiled is not None and 0 < r < compiled.rois:
        # the compiled pass / refiner have a fixed shape of compiled.rois candidates: fill up with copies of the
        # first (each candidate is refined on its own, and its copies reach the same points), dropped at the end
        fill = torch.zeros(compiled.rois - r, dtype=torch.long, device=labels.device)
        scores, labels, boxes = torch.cat([scores, scores[fill]]), torch.cat([labels, labels[fill]]), torch.cat(
            [boxes, boxes[fill]])
    points = points.float()
    alpha = scores.new_tensor(cfg.score_alpha)[labels]
    new_scores = scores
    hits = first_hit_map(points) if cfg.visibility else None
    cells = (cells if cells is not None else PointCells(points)) if r else None
    fused = getattr(compiled, "refine_pass", None) if compiled is not None and scores.shape[0] == compiled.rois else None
    for _ in range(passes or cfg.passes) if r else ():  # no candidate of a refined class: nothing to refine
        near = _cap_near(_near_any_box(points, boxes, cfg.margin, cells=cells), points.dtype)
        out = None if fused is None or near.shape[0] < cfg.points else fused(points[near], near, boxes, scores,
                                                                               labels, hits, intensity_scale)
        if out is not None:  # the whole pass compiled (`RefinePass`)
            new_scores, boxes = out
            continue
        feats, valid = roi_point_features(points, boxes, cfg.points, cfg.margin, intensity_scale,
                                          None if compiled is None else compiled.features, near=near)
        context = refiner_context(cfg, num_classes, scores, labels, boxes, hits)
        run = refiner if compiled is None or feats.shape[0] != compiled.rois else compiled.refiner
        iou_logit, residual = run(feats, valid, context)
        new_scores, boxes = pass_outputs(scores, alpha, boxes, iou_logit, residual, valid)
    new_scores, labels, boxes = new_scores[:r], labels[:r], boxes[:r]  # without the fill
    if through is not None:
        return torch.cat([new_scores, through[0]]), torch.cat([labels, through[1]]), torch.cat([boxes, through[2]])
    return new_scores, labels, boxes


def pass_outputs(scores: torch.Tensor, alpha: torch.Tensor, boxes: torch.Tensor, iou_logit: torch.Tensor,
                 residual: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass's scores (stage 1's ``scores`` fused with the predicted IoU, per-candidate weight ``alpha``) and
    next boxes."""
    new_scores = scores.clamp_min(0.0).pow(1.0 - alpha) * torch.sigmoid(iou_logit).pow(alpha)
    # a candidate without a single point in reach gives stage 2 nothing to look at: it may lose score
    # but never gain any (s1 ** (1 - a) lifts a low s1 a lot), and its box stays stage 1's
    has_points = valid.any(dim=1)
    return torch.where(has_points, new_scores, torch.minimum(new_scores, scores)), next_boxes(boxes, residual, valid)


def next_boxes(boxes: torch.Tensor, residual: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """One pass's refined boxes: the residuals applied, except to boxes without a point in reach (their
    ``valid`` row is all false), which stay as they are."""
    return torch.where(valid.any(dim=1, keepdim=True), apply_residuals(boxes, residual), boxes)


def parse_refine(section, classes: tuple[str, ...], source: str, per_class, positive_ints) -> RefineConfig | None:
    """The model YAML's ``refine`` section (absent or null: no stage 2)."""
    from livox_infer.errors import ConfigError

    if section is None:
        return None
    allowed = {"rois", "points", "margin", "point_channels", "hidden", "score_alpha", "passes", "visibility", "classes"}
    if not isinstance(section, dict) or set(section) - allowed:
        raise ConfigError(f"model config {source}: bad refine section {section!r}; allowed keys {sorted(allowed)}")
    d = RefineConfig()
    (rois,) = positive_ints([section.get("rois", d.rois)], "refine.rois")
    (points,) = positive_ints([section.get("points", d.points)], "refine.points")
    (passes,) = positive_ints([section.get("passes", d.passes)], "refine.passes")
    if passes > 4:
        raise ConfigError(f"refine.passes must be 1..4 (each pass costs a refiner run), got {passes}")
    margin = section.get("margin", d.margin)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (0.0 <= margin <= 5.0):
        raise ConfigError(f"refine.margin must be metres in [0, 5], got {margin!r}")
    visibility = section.get("visibility")
    if visibility is not None:
        visibility = positive_ints(visibility, "refine.visibility")
        if len(visibility) != 2 or max(visibility) > 32:
            raise ConfigError(f"refine.visibility must be [along, across] samples (1..32 each), got {visibility!r}")
    return RefineConfig(
        rois=rois, points=points, margin=float(margin),
        point_channels=positive_ints(section.get("point_channels", d.point_channels), "refine.point_channels"),
        hidden=positive_ints(section.get("hidden", d.hidden), "refine.hidden"),
        score_alpha=per_class(section.get("score_alpha", 0.75), classes, "refine.score_alpha", 0.0, 1.0),
        passes=passes, visibility=tuple(visibility) if visibility else None,
        refined=_refined_classes(section.get("classes"), classes, source),
    )


def _refined_classes(names, classes: tuple[str, ...], source: str) -> tuple[bool, ...]:
    """``refine.classes`` (the classes stage 2 refines; absent: all) as one flag per class."""
    from livox_infer.errors import ConfigError

    if names is None:
        return tuple(True for _ in classes)
    if not isinstance(names, (list, tuple)) or not names or any(n not in classes for n in names):
        raise ConfigError(f"model config {source}: refine.classes must be a non-empty list of the model's classes "
                          f"{list(classes)}, got {names!r}")
    return tuple(c in names for c in classes)


def refiner_example_inputs(cfg: RefineConfig, num_classes: int, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """Inputs of the refiner's fixed compiled shape, (rois, points): features, validity, context (compiling it)."""
    return (torch.zeros((cfg.rois, cfg.points, POINT_FEATURES), device=device),
            torch.ones((cfg.rois, cfg.points), dtype=torch.bool, device=device),
            torch.zeros((cfg.rois, context_size(num_classes, cfg.visibility_size)), device=device))


class SampledFeatures(nn.Module):
    """`sampled_features` with its scalars fixed, as a module (what `livox-infer export` compiles into a package)."""

    def __init__(self, k: int, margin: float, intensity_scale: float) -> None:
        super().__init__()
        self.k, self.margin, self.intensity_scale = int(k), float(margin), float(intensity_scale)

    def forward(self, points: torch.Tensor, near: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sampled_features(points, near, boxes, self.k, self.margin, self.intensity_scale)


class RefinePass(nn.Module):
    """One refinement pass of `refine_candidates` from the sampled points on (point features, context, refiner,
    fused score, next boxes) for exactly ``cfg.rois`` candidates and at least ``cfg.points`` near points, as one
    module: what `livox-infer export` compiles into a package (`livox_infer.detector.aoti.PackageStage2`), so a pass
    is one compiled call instead of two and a dozen small eager ops. Inputs: the near points (N, 4) and their
    indices in the cloud (N,), boxes (R, 7), stage 1's scores (R,) and labels (R,), and with ``cfg.visibility`` the
    frame's `first_hit_map`; returns (scores (R,), boxes (R, 7))."""

    def __init__(self, refiner: RoiRefiner, cfg: RefineConfig, num_classes: int, intensity_scale: float) -> None:
        super().__init__()
        self.refiner, self.cfg, self.num_classes = refiner, cfg, num_classes
        self.intensity_scale = float(intensity_scale)
        self.register_buffer("alpha", torch.tensor(cfg.score_alpha, dtype=torch.float32), persistent=False)

    def forward(self, points: torch.Tensor, near: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor,
                labels: torch.Tensor, first: torch.Tensor | None = None, observed: torch.Tensor | None = None):
        cfg = self.cfg
        feats, valid = sampled_features(points, near, boxes, cfg.points, cfg.margin, self.intensity_scale)
        hits = (first, observed) if cfg.visibility else None
        iou_logit, residual = self.refiner(feats, valid, refiner_context(cfg, self.num_classes, scores, labels,
                                                                         boxes, hits))
        return pass_outputs(scores, self.alpha[labels], boxes, iou_logit, residual, valid)


class CompiledRefiner:
    """torch.compile'd stage-2 parts (the compiled pipeline's, issue 33): `sampled_features` with a dynamic point
    count, and the refiner on its fixed (rois, points) shape; the rest of stage 2 (which points are near, the
    context, the residuals) is cheap and stays eager."""

    def __init__(self, refiner: RoiRefiner, cfg: RefineConfig) -> None:
        self.rois = cfg.rois
        self.features = torch.compile(sampled_features, dynamic=True, fullgraph=True)
        self.refiner = torch.compile(refiner, dynamic=False, fullgraph=True)
