"""CenterPoint losses: penalty-reduced focal loss on the heatmap, L1 on the regression at object centres."""

from __future__ import annotations

import torch

from livox_infer.model.network import HEAD_CHANNELS


def focal_loss(logits: torch.Tensor, target: torch.Tensor, alpha: float = 2.0, beta: float = 4.0) -> torch.Tensor:
    """CenterNet focal loss, normalised by the number of positives (cells where target == 1)."""
    pred = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).to(pred.dtype)
    neg = 1.0 - pos
    pos_loss = torch.log(pred) * (1 - pred) ** alpha * pos
    neg_loss = torch.log(1 - pred) * pred**alpha * (1 - target) ** beta * neg
    num_pos = pos.sum().clamp_min(1.0)
    return -(pos_loss.sum() + neg_loss.sum()) / num_pos


def gather_regression(heads: dict[str, torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """Regression head values at flat head-cell indices: (B, max_objects, 8) in target order."""
    reg = torch.cat([heads[n] for n in HEAD_CHANNELS], dim=1)  # (B, 8, h, w)
    b, c = reg.shape[:2]
    reg = reg.reshape(b, c, -1)
    return reg.gather(2, index[:, None, :].expand(b, c, index.shape[1])).permute(0, 2, 1)


REGRESSION_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # off_x off_y z log_l log_w log_h sin2yaw cos2yaw


def detection_loss(heads: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], reg_weight: float = 1.0):
    """Total loss and its parts (as floats) for a batch."""
    hm = focal_loss(heads["heatmap"], targets["heatmap"])
    pred = gather_regression(heads, targets["index"])
    mask = targets["mask"][..., None]
    w = pred.new_tensor(REGRESSION_WEIGHTS)
    l1 = ((pred - targets["regression"]).abs() * mask * w).sum() / mask.sum().clamp_min(1.0)
    total = hm + reg_weight * l1
    return total, {"heatmap": float(hm.detach()), "regression": float(l1.detach())}
