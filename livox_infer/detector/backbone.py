"""BEV backbone: a stride-1 (or 2) stem and stride-2 stages of conv+BN+ReLU, optionally with residual blocks.

Input (B, C, H, W) from the voxelizer; output the stem's and every stage's feature map (finest first), with
their strides and channel counts for the neck.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.detector.config import ModelConfig


def conv_bn(cin: int, cout: int, stride: int = 1, k: int = 3) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    """relu(x + bn(conv(relu(bn(conv(x)))))) with the last BatchNorm's scale at zero, so a new block is
    the identity on its (ReLU, hence non-negative) input: a trained network grows without changing
    its output, and training then decides what the block adds (zero-init residuals, Goyal et al. 2017)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(  # a Sequential so that fuse_batchnorm folds its conv+BN pairs
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )
        nn.init.zeros_(self.body[4].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        stem = [conv_bn(cfg.grid.n_channels, cfg.stem_channels, stride=cfg.stem_stride)]
        stem += [conv_bn(cfg.stem_channels, cfg.stem_channels) for _ in range(cfg.stem_blocks - 1)]
        self.stem = nn.Sequential(*stem)
        stages = []
        prev = cfg.stem_channels
        residual = cfg.residual_blocks or (0,) * len(cfg.stage_channels)
        for ch, blocks, extra in zip(cfg.stage_channels, cfg.stage_blocks, residual):
            layers = [conv_bn(prev, ch, stride=2)] + [conv_bn(ch, ch) for _ in range(blocks - 1)]
            layers += [ResidualBlock(ch) for _ in range(extra)]
            stages.append(nn.Sequential(*layers))
            prev = ch
        self.stages = nn.ModuleList(stages)
        self.strides = [cfg.stem_stride * (1 << i) for i in range(len(stages) + 1)]  # stem, stage 1, ...
        self.channels = [cfg.stem_channels, *cfg.stage_channels]

    def forward(self, bev: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(bev)
        feats = [x]
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats
