"""CenterPoint losses: penalty-reduced focal loss on the heatmap, L1 on the regression at object centres,
and (with an IoU head) binary cross-entropy of the predicted IoU against the IoU the decoded box has."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from livox_infer.detector.boxes import bev_corners, paired_bev_iou
from livox_infer.detector.head import HEAD_CHANNELS


def focal_loss(logits: torch.Tensor, target: torch.Tensor, alpha: float = 2.0, beta: float = 4.0,
               ignore: torch.Tensor | None = None, class_weight: torch.Tensor | None = None) -> torch.Tensor:
    """CenterNet focal loss, normalised by the number of positives (cells where target == 1).
    ``ignore`` (B, h, w): 1 where negatives do not count (the footprint of an ignored object).
    ``class_weight`` (C,): each class channel's terms (positives and negatives) times its weight."""
    pred = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).to(pred.dtype)
    neg = 1.0 - pos
    if ignore is not None:
        neg = neg * (1.0 - ignore[:, None].to(pred.dtype))
    pos_loss = torch.log(pred) * (1 - pred) ** alpha * pos
    neg_loss = torch.log(1 - pred) * pred**alpha * (1 - target) ** beta * neg
    num_pos = pos.sum().clamp_min(1.0)
    if class_weight is not None:
        w = class_weight.to(pred.dtype)[None, :, None, None]
        pos_loss, neg_loss = pos_loss * w, neg_loss * w
    return -(pos_loss.sum() + neg_loss.sum()) / num_pos


def gather_regression(heads: dict[str, torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """Regression head values at flat head-cell indices: (B, E, 8) in target order."""
    reg = torch.cat([heads[n] for n in HEAD_CHANNELS], dim=1)  # (B, 8, h, w)
    b, c = reg.shape[:2]
    reg = reg.reshape(b, c, -1)
    return reg.gather(2, index[:, None, :].expand(b, c, index.shape[1])).permute(0, 2, 1)


REGRESSION_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # off_x off_y z log_l log_w log_h sin2yaw cos2yaw


def boxes_from_regression(reg: torch.Tensor, cell_size: float) -> torch.Tensor:
    """(K, 8) regression entries -> (K, 7) boxes relative to the entry's cell (x, y in metres)."""
    size = torch.exp(reg[:, 3:6].clamp(-3.0, 3.5))
    yaw = 0.5 * torch.atan2(reg[:, 6], reg[:, 7])
    return torch.cat([reg[:, 0:2] * cell_size, reg[:, 2:3], size, yaw[:, None]], dim=1)


def bev_corners_from_regression(reg: torch.Tensor, cell_size: float) -> torch.Tensor:
    """(..., 8) regression entries -> (..., 4, 2) BEV corners in metres, relative to the entry's cell."""
    corners = bev_corners(boxes_from_regression(reg.reshape(-1, reg.shape[-1]), cell_size))
    return corners.reshape(*reg.shape[:-1], 4, 2)


def corner_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, cell_size: float) -> torch.Tensor:
    """Mean BEV corner distance (m) between predicted and target boxes, weighted per entry.

    Couples centre, size and yaw the way IoU does: a 7 degree yaw error costs a 4.5 m car ~0.27 m at
    its corners, where the (sin 2yaw, cos 2yaw) L1 term sees only 0.24. The corner order of a
    rectangle turned by pi is shifted by two, so the smaller of the two orderings counts. Entries
    whose predicted yaw vector is near zero (atan2 undefined) are left out."""
    pc = bev_corners_from_regression(pred, cell_size)
    tc = bev_corners_from_regression(target, cell_size)
    d0 = (pc - tc).norm(dim=-1).mean(-1)
    d1 = (pc - tc.roll(2, dims=-2)).norm(dim=-1).mean(-1)
    ok = (pred[..., 6] ** 2 + pred[..., 7] ** 2 > 0.01).to(pred.dtype) * weight
    return (torch.minimum(d0, d1) * ok).sum() / weight.sum().clamp_min(1.0)


def iou_loss(heads: dict[str, torch.Tensor], pred: torch.Tensor, targets: dict[str, torch.Tensor],
             cell_size: float) -> torch.Tensor:
    """BCE of the IoU head at object centres against the BEV IoU of the box regressed there (detached:
    the IoU head learns to judge the box, it does not move it). Mean over the weighted entries."""
    logit = heads["iou"].reshape(heads["iou"].shape[0], -1).gather(1, targets["index"])  # (B, E)
    used = targets["mask"] > 0
    with torch.no_grad():
        target = paired_bev_iou(boxes_from_regression(pred[used].float(), cell_size),
                                boxes_from_regression(targets["regression"][used].float(), cell_size))
    w = targets["mask"][used]
    bce = F.binary_cross_entropy_with_logits(logit[used], target.to(logit.dtype), reduction="none")
    return (bce * w).sum() / w.sum().clamp_min(1.0)


def detection_loss(heads: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], reg_weight: float = 1.0,
                   corner_weight: float = 0.0, cell_size: float = 1.0, heat_class_weight=None):
    """Total loss and its parts (as floats) for a batch. ``corner_weight`` > 0 adds `corner_loss`; an
    ``iou`` head map adds `iou_loss` (``cell_size``: the head cell in metres, to put offsets in metres).
    ``heat_class_weight``: one heatmap loss weight per class (None: all 1)."""
    cw = None if heat_class_weight is None else heads["heatmap"].new_tensor(heat_class_weight)
    hm = focal_loss(heads["heatmap"], targets["heatmap"], ignore=targets.get("ignore"), class_weight=cw)
    pred = gather_regression(heads, targets["index"])
    mask = targets["mask"][..., None]
    w = pred.new_tensor(REGRESSION_WEIGHTS)
    l1 = ((pred - targets["regression"]).abs() * mask * w).sum() / mask.sum().clamp_min(1.0)
    total = hm + reg_weight * l1
    parts = {"heatmap": float(hm.detach()), "regression": float(l1.detach())}
    if "iou" in heads:
        iou = iou_loss(heads, pred.detach(), targets, cell_size)
        total = total + iou
        parts["iou"] = float(iou.detach())
    if corner_weight > 0:
        corners = corner_loss(pred, targets["regression"], targets["mask"], cell_size)
        total = total + corner_weight * corners
        parts["corners"] = float(corners.detach())
    return total, parts
