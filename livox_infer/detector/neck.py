"""FPN-like neck: 1x1 laterals of every backbone map at or below the head resolution, upsampled to the
finest of them (nearest), summed, then one 3x3 conv+BN+ReLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.detector.backbone import conv_bn
from livox_infer.detector.config import ModelConfig


class Neck(nn.Module):
    def __init__(self, cfg: ModelConfig, strides: list[int], channels: list[int]) -> None:
        super().__init__()
        self.lateral_from = [i for i, s in enumerate(strides) if s >= cfg.out_stride]
        self.laterals = nn.ModuleList(conv_bn(channels[i], cfg.neck_channels, k=1) for i in self.lateral_from)
        self.fuse = conv_bn(cfg.neck_channels, cfg.head_channels)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        sources = [feats[i] for i in self.lateral_from]
        target_hw = sources[0].shape[-2:]
        neck = None
        for lat, f in zip(self.laterals, sources):
            y = lat(f)
            if y.shape[-2:] != target_hw:
                y = F.interpolate(y, size=target_hw, mode="nearest")
            neck = y if neck is None else neck + y
        return self.fuse(neck)
