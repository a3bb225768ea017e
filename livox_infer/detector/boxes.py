"""Box geometry in torch: BEV corners, rotated BEV / 3D IoU, rotated NMS.

Boxes are (N, 7) ``[x, y, z, l, w, h, yaw]`` (z = geometric centre, l along the heading).
The rotated intersection is the convex polygon formed by the corners of each rectangle that
lie inside the other plus the pairwise edge intersections; it is computed for all pairs at
once (no Python loop over boxes), so it stays usable inside training and evaluation.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_EPS = 1e-6


def wrap_angle(a):
    """Wrap radians to [-pi, pi) (torch tensors and numpy arrays)."""
    if isinstance(a, torch.Tensor):
        return torch.remainder(a + math.pi, 2 * math.pi) - math.pi
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi


def axis_angle(a):
    """Box axis angle modulo pi, in [-pi/2, pi/2) (the model does not tell front from back)."""
    return torch.remainder(a + math.pi / 2, math.pi) - math.pi / 2 if isinstance(a, torch.Tensor) else (
        np.remainder(a + math.pi / 2, math.pi) - math.pi / 2
    )


def bev_corners(boxes: torch.Tensor) -> torch.Tensor:
    """(N, 7+) boxes -> (N, 4, 2) BEV corners, counter-clockwise."""
    x, y, l, w, yaw = boxes[:, 0], boxes[:, 1], boxes[:, 3], boxes[:, 4], boxes[:, 6]
    c, s = torch.cos(yaw), torch.sin(yaw)
    # local corners (ccw): (+l/2,+w/2), (-l/2,+w/2), (-l/2,-w/2), (+l/2,-w/2)
    sx = boxes.new_tensor([0.5, -0.5, -0.5, 0.5])
    sy = boxes.new_tensor([0.5, 0.5, -0.5, -0.5])
    lx = l[:, None] * sx  # (N,4)
    ly = w[:, None] * sy
    cx = x[:, None] + c[:, None] * lx - s[:, None] * ly
    cy = y[:, None] + s[:, None] * lx + c[:, None] * ly
    return torch.stack([cx, cy], dim=-1)


def _inside(points: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
    """points (..., P, 2) inside convex ccw quad corners (..., 4, 2) -> (..., P) bool (boundary counts)."""
    a = corners
    b = torch.roll(corners, shifts=-1, dims=-2)
    edge = b - a  # (...,4,2)
    rel = points[..., :, None, :] - a[..., None, :, :]  # (...,P,4,2)
    cross = edge[..., None, :, 0] * rel[..., 1] - edge[..., None, :, 1] * rel[..., 0]
    scale = edge.norm(dim=-1)[..., None, :].clamp_min(_EPS)
    return (cross / scale >= -1e-5).all(dim=-1)


def _paired_intersection_area(ca: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
    """Intersection areas of aligned corner sets ca, cb (K, 4, 2) -> (K,)."""
    k = ca.shape[0]
    a_in_b = _inside(ca, cb)  # (K,4)
    b_in_a = _inside(cb, ca)
    # edge-edge intersections: edges p + t r (of a), q + u s (of b)
    p = ca[:, :, None, :]
    r = (torch.roll(ca, -1, dims=1) - ca)[:, :, None, :]
    q = cb[:, None, :, :]
    s = (torch.roll(cb, -1, dims=1) - cb)[:, None, :, :]
    denom = r[..., 0] * s[..., 1] - r[..., 1] * s[..., 0]  # (K,4,4)
    qp = q - p
    parallel = denom.abs() < 1e-12
    safe = torch.where(parallel, torch.ones_like(denom), denom)
    t = (qp[..., 0] * s[..., 1] - qp[..., 1] * s[..., 0]) / safe
    u = (qp[..., 0] * r[..., 1] - qp[..., 1] * r[..., 0]) / safe
    edge_ok = ~parallel & (t >= -1e-9) & (t <= 1 + 1e-9) & (u >= -1e-9) & (u <= 1 + 1e-9)
    inter = (p + t[..., None] * r).reshape(k, 16, 2)
    pts = torch.cat([ca, cb, inter], dim=1)  # (K,24,2)
    valid = torch.cat([a_in_b, b_in_a, edge_ok.reshape(k, 16)], dim=1)
    count = valid.sum(dim=1)
    vf = valid.to(pts.dtype)
    centre = (pts * vf[..., None]).sum(dim=1) / count.clamp_min(1)[:, None].to(pts.dtype)
    rel = pts - centre[:, None, :]
    ang = torch.atan2(rel[..., 1], rel[..., 0])
    ang = torch.where(valid, ang, torch.full_like(ang, 10.0))  # invalid points sort last
    order = ang.argsort(dim=1)
    sp = torch.gather(pts, 1, order[..., None].expand(k, 24, 2))
    sv = torch.gather(valid, 1, order)
    # Replace invalid (trailing) points by the first sorted point: they then add zero area.
    sp = torch.where(sv[..., None], sp, sp[:, :1, :].expand_as(sp))
    nxt = torch.roll(sp, -1, dims=1)
    area = 0.5 * (sp[..., 0] * nxt[..., 1] - sp[..., 1] * nxt[..., 0]).sum(dim=1)
    return torch.where(count >= 3, area.abs(), torch.zeros_like(area))


def bev_intersection_area(a: torch.Tensor, b: torch.Tensor, paired_area=None) -> torch.Tensor:
    """Pairwise BEV intersection areas of boxes a (N,7+) and b (M,7+) -> (N, M).

    Only pairs whose circumscribed circles overlap are clipped; the rest are 0. ``paired_area``: a compiled
    `_paired_intersection_area` to clip them with (a package's, for the NMS).
    """
    n, m = a.shape[0], b.shape[0]
    out = torch.zeros((n, m), dtype=torch.float64, device=a.device)
    if n == 0 or m == 0:
        return out.to(a.dtype)
    a64, b64 = a.double(), b.double()  # float64: the clipping is sensitive to round-off
    ra = 0.5 * torch.hypot(a64[:, 3], a64[:, 4])
    rb = 0.5 * torch.hypot(b64[:, 3], b64[:, 4])
    dist = torch.cdist(a64[:, :2], b64[:, :2])
    ii, jj = torch.nonzero(dist < ra[:, None] + rb[None, :], as_tuple=True)
    if ii.numel():
        out[ii, jj] = (paired_area or _paired_intersection_area)(bev_corners(a64)[ii], bev_corners(b64)[jj])
    return out.to(a.dtype)


def bev_iou(a: torch.Tensor, b: torch.Tensor, paired_area=None) -> torch.Tensor:
    """Pairwise rotated BEV IoU (N, M) (``paired_area``: see `bev_intersection_area`)."""
    inter = bev_intersection_area(a, b, paired_area)
    area_a = (a[:, 3] * a[:, 4])[:, None]
    area_b = (b[:, 3] * b[:, 4])[None, :]
    return inter / (area_a + area_b - inter).clamp_min(_EPS)


class PairedIntersectionArea(torch.nn.Module):
    """`_paired_intersection_area` as a module (what `livox-infer export` compiles into a package for the NMS: the
    overlapping pairs' clipping, ~60 small ops eagerly; `livox_infer.detector.aoti.PackagePairedArea`)."""

    def forward(self, ca: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        return _paired_intersection_area(ca, cb)


def paired_bev_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rotated BEV IoU of aligned boxes a[i], b[i] (K, 7+) -> (K,)."""
    if a.shape[0] == 0:
        return a.new_zeros(0)
    a64, b64 = a.double(), b.double()
    inter = _paired_intersection_area(bev_corners(a64), bev_corners(b64))
    union = a64[:, 3] * a64[:, 4] + b64[:, 3] * b64[:, 4] - inter
    return (inter / union.clamp_min(_EPS)).clamp(0.0, 1.0).to(a.dtype)


def iou_3d(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise rotated 3D IoU (N, M): BEV intersection times vertical overlap."""
    inter = bev_intersection_area(a, b)
    za0, za1 = a[:, 2] - a[:, 5] / 2, a[:, 2] + a[:, 5] / 2
    zb0, zb1 = b[:, 2] - b[:, 5] / 2, b[:, 2] + b[:, 5] / 2
    dz = (torch.minimum(za1[:, None], zb1[None]) - torch.maximum(za0[:, None], zb0[None])).clamp_min(0)
    inter3 = inter * dz
    vol_a = (a[:, 3] * a[:, 4] * a[:, 5])[:, None]
    vol_b = (b[:, 3] * b[:, 4] * b[:, 5])[None, :]
    return inter3 / (vol_a + vol_b - inter3).clamp_min(_EPS)


def rotated_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold, max_keep: int,
                cross_class_iou: float | None = None, paired_area=None) -> torch.Tensor:
    """Class-wise greedy NMS on rotated BEV IoU. Returns kept indices, best score first.

    ``iou_threshold`` is a float or a per-class sequence (indexed by label). With ``cross_class_iou``
    a kept box also suppresses lower-scored boxes of *other* classes overlapping it by more than that:
    one object gets one class (the network often fires pedestrian and cyclist on the same rider).
    ``paired_area``: a compiled overlap clipping (see `bev_intersection_area`).
    """
    n = boxes.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = scores.argsort(descending=True)
    b = boxes[order]
    lab = labels[order]
    iou = bev_iou(b, b, paired_area).cpu().numpy()
    same = (lab[:, None] == lab[None, :]).cpu().numpy()
    if isinstance(iou_threshold, (int, float)):
        thr_row = np.full(n, float(iou_threshold))
    else:
        thr_row = np.asarray(iou_threshold, dtype=np.float64)[lab.cpu().numpy()]
    suppress = (iou > thr_row[:, None]) & same
    if cross_class_iou is not None:
        suppress |= (iou > float(cross_class_iou)) & ~same
    removed = np.zeros(n, dtype=bool)
    keep: list[int] = []
    for i in range(n):
        if removed[i]:
            continue
        keep.append(i)
        if len(keep) >= max_keep:
            break
        removed |= suppress[i]
    return order[torch.as_tensor(keep, dtype=torch.long, device=boxes.device)]


def points_in_boxes(points, boxes) -> np.ndarray:
    """Number of points inside each box (numpy or torch inputs) -> (M,) int64.

    A point counts when it lies inside the rotated BEV rectangle and between the box's bottom and top."""
    p = np.asarray(points, dtype=np.float32).reshape(-1, points.shape[-1] if hasattr(points, "shape") else 4)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    out = np.zeros(b.shape[0], np.int64)
    if p.shape[0] == 0:
        return out
    for i, (x, y, z, l, w, h, yaw) in enumerate(b):
        r = 0.5 * math.hypot(l, w)
        near = (np.abs(p[:, 0] - x) <= r) & (np.abs(p[:, 1] - y) <= r) & (np.abs(p[:, 2] - z) <= h / 2)
        q = p[near]
        if q.shape[0] == 0:
            continue
        dx, dy = q[:, 0] - x, q[:, 1] - y
        c, s = math.cos(yaw), math.sin(yaw)
        lx = c * dx + s * dy
        ly = -s * dx + c * dy
        out[i] = int(np.count_nonzero((np.abs(lx) <= l / 2) & (np.abs(ly) <= w / 2)))
    return out


def yaw_to_quaternion(yaw: float) -> tuple[float, float, float, float]:
    """Rotation about +z by ``yaw`` radians as a unit quaternion (x, y, z, w)."""
    half = 0.5 * float(yaw)
    return 0.0, 0.0, math.sin(half), math.cos(half)


def quaternion_to_yaw(x: float, y: float, z: float, w: float) -> float:
    """Yaw (rotation about +z) of a quaternion, wrapped to [-pi, pi)."""
    yaw = math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    return (yaw + math.pi) % (2.0 * math.pi) - math.pi


def box_corners(box) -> np.ndarray:
    """The 8 corners (8, 3) of one box [x, y, z, l, w, h, yaw] (numpy): 0-3 bottom, 4-7 top, counter-clockwise
    as `bev_corners`."""
    box = np.asarray(box, dtype=np.float64)[:7]
    xy = bev_corners(torch.from_numpy(box[None]))[0].numpy()
    z, h = box[2], box[5]
    return np.concatenate([np.c_[xy, np.full(4, z - 0.5 * h)], np.c_[xy, np.full(4, z + 0.5 * h)]], axis=0)

