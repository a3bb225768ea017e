"""From head maps to boxes: static-shape top-k decoding (compilable), then thresholds + rotated NMS."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.model.boxes import axis_angle, rotated_nms
from livox_infer.model.config import ModelConfig
from livox_infer.model.network import BevDetector
from livox_infer.model.targets import decode_boxes


def topk_decode(heads: dict[str, torch.Tensor], cfg: ModelConfig, k: int | None = None):
    """Peaks of the heatmap (3x3 max-pool) -> fixed k candidates per frame.

    Returns scores (B, k), labels (B, k) int64, boxes (B, k, 7) in the voxelizer frame. Shapes do
    not depend on the data, so this part compiles and graph-captures together with the network.
    """
    k = k or cfg.top_k
    heat = torch.sigmoid(heads["heatmap"])
    b, c, h, w = heat.shape
    peaks = F.max_pool2d(heat, 3, stride=1, padding=1)
    heat = heat * (peaks == heat).to(heat.dtype)
    scores, flat = heat.reshape(b, -1).topk(k, dim=1)
    labels = flat // (h * w)
    cell = flat % (h * w)
    row, col = cell // w, cell % w

    def gather(name: str) -> torch.Tensor:
        m = heads[name]
        m = m.reshape(b, m.shape[1], h * w)
        return m.gather(2, cell[:, None, :].expand(b, m.shape[1], k)).permute(0, 2, 1)

    boxes = decode_boxes(col, row, gather("offset"), gather("z")[..., 0], gather("size"), gather("yaw"), cfg)
    return scores, labels, boxes


class InferenceModel(nn.Module):
    """Network + top-k decoding: (1, C, H, W) -> scores (k,), labels (k,), boxes (k, 7). Static shapes."""

    def __init__(self, net: BevDetector, cfg: ModelConfig) -> None:
        super().__init__()
        self.net = net
        self.cfg = cfg

    def forward(self, bev: torch.Tensor):
        scores, labels, boxes = topk_decode(self.net(bev), self.cfg)
        return scores[0], labels[0], boxes[0]


def select_detections(
    scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, score_thresholds, nms_iou, max_detections: int,
    cross_class_iou: float | None = None,
):
    """Per-class score thresholds, then rotated-BEV NMS (class-wise, plus cross-class when given).
    Inputs (k,), (k,), (k, 7)."""
    thr = torch.as_tensor(score_thresholds, dtype=scores.dtype, device=scores.device)
    keep = scores >= thr[labels]
    scores, labels, boxes = scores[keep], labels[keep], boxes[keep]
    idx = rotated_nms(boxes, scores, labels, list(nms_iou), max_detections, cross_class_iou)
    boxes = boxes[idx].clone()
    boxes[:, 6] = axis_angle(boxes[:, 6])
    return scores[idx], labels[idx], boxes
