"""CenterPoint-style centre head: residual blocks, a class heatmap and a box-regression branch.

Outputs at 1/out_stride resolution: ``heatmap`` (B, K, h, w) logits, ``offset`` (B, 2, h, w) sub-cell x/y,
``z`` (B, 1, h, w) box centre height above ground (m), ``size`` (B, 3, h, w) log(l, w, h), ``yaw`` (B, 2, h, w)
sin/cos of twice the yaw (`livox_infer.detector.box_coding`), and with ``cfg.iou_head`` also ``iou`` (B, 1, h, w):
logit of the BEV IoU of the cell's box with its object.
"""

from __future__ import annotations

import torch
from torch import nn

from livox_infer.detector.backbone import ResidualBlock, conv_bn
from livox_infer.detector.config import ModelConfig

HEAD_CHANNELS = {"offset": 2, "z": 1, "size": 3, "yaw": 2}  # the box regression, in this order
HEATMAP_PRIOR_BIAS = -2.19  # sigmoid(-2.19) ~ 0.1: CenterNet's prior so the focal loss starts stable


def head_channels(cfg: ModelConfig) -> dict[str, int]:
    """Regression-head outputs of a config: the box, plus the IoU prediction when configured."""
    return {**HEAD_CHANNELS, **({"iou": 1} if cfg.iou_head else {})}


class CenterHead(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.outputs = tuple(head_channels(cfg).items())  # regression channels, split by name in forward
        self.blocks = nn.Sequential(*(ResidualBlock(cfg.head_channels) for _ in range(cfg.head_residual_blocks)))
        self.heatmap = nn.Conv2d(cfg.head_channels, cfg.num_classes, 1)
        # the box regression gets its own 3x3 layer (CenterPoint-style task head); the heatmap reads the neck
        self.regression = nn.Sequential(
            conv_bn(cfg.head_channels, cfg.head_channels),
            nn.Conv2d(cfg.head_channels, sum(n for _, n in self.outputs), 1),
        )
        nn.init.constant_(self.heatmap.bias, HEATMAP_PRIOR_BIAS)
        nn.init.normal_(self.regression[-1].weight, std=0.001)
        nn.init.zeros_(self.regression[-1].bias)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.blocks(x)
        reg = self.regression(h)
        out = {"heatmap": self.heatmap(h)}
        start = 0
        for name, n in self.outputs:
            out[name] = reg[:, start : start + n]
            start += n
        return out
