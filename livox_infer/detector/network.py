"""CenterPoint-style BEV detector: stride-1 stem, stride-2 stages, FPN-like neck, center heads.

Input (B, C, H, W) from the voxelizer; output dict of head maps at 1/out_stride resolution:
``heatmap`` (B, K, h, w) logits, ``offset`` (B, 2, h, w) sub-cell x/y, ``z`` (B, 1, h, w) box
centre height above ground (m), ``size`` (B, 3, h, w) log(l, w, h), ``yaw`` (B, 2, h, w) sin/cos of twice the yaw (see targets.py),
and with ``cfg.iou_head`` also ``iou`` (B, 1, h, w): logit of the BEV IoU of the cell's box with its object.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.detector.config import ModelConfig
from livox_infer.detector.refine import RoiRefiner

HEAD_CHANNELS = {"offset": 2, "z": 1, "size": 3, "yaw": 2}  # the box regression, in this order


def head_channels(cfg: ModelConfig) -> dict[str, int]:
    """Regression-head outputs of a config: the box, plus the IoU prediction when configured."""
    return {**HEAD_CHANNELS, **({"iou": 1} if cfg.iou_head else {})}


HEATMAP_PRIOR_BIAS = -2.19  # sigmoid(-2.19) ~ 0.1: CenterNet's prior so the focal loss starts stable


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


class BevDetector(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.outputs = tuple(head_channels(cfg).items())  # regression channels, split by name in forward
        cin = cfg.grid.n_channels
        stem = [conv_bn(cin, cfg.stem_channels, stride=cfg.stem_stride)]
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
        # Neck: 1x1 laterals of every feature map at or below the head resolution, upsampled and summed.
        strides = [cfg.stem_stride * (1 << i) for i in range(len(stages) + 1)]  # stem, stage 1, ...
        channels = [cfg.stem_channels, *cfg.stage_channels]
        self.lateral_from = [i for i, s in enumerate(strides) if s >= cfg.out_stride]
        self.laterals = nn.ModuleList(conv_bn(channels[i], cfg.neck_channels, k=1) for i in self.lateral_from)
        self.fuse = conv_bn(cfg.neck_channels, cfg.head_channels)
        self.head_blocks = nn.Sequential(*(ResidualBlock(cfg.head_channels) for _ in range(cfg.head_residual_blocks)))
        self.heatmap = nn.Conv2d(cfg.head_channels, cfg.num_classes, 1)
        # the box regression gets its own 3x3 layer (CenterPoint-style task head); the heatmap reads the neck
        self.regression = nn.Sequential(
            conv_bn(cfg.head_channels, cfg.head_channels),
            nn.Conv2d(cfg.head_channels, sum(n for _, n in self.outputs), 1),
        )
        # stage 2 lives here so that its weights travel in the same file; forward() does not run it (it needs
        # the points: model/refine.py, run by the pipeline after the network)
        self.refiner = RoiRefiner(cfg.refine, cfg.num_classes) if cfg.refine else None
        nn.init.constant_(self.heatmap.bias, HEATMAP_PRIOR_BIAS)
        nn.init.normal_(self.regression[-1].weight, std=0.001)
        nn.init.zeros_(self.regression[-1].bias)

    def forward(self, bev: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(bev)
        feats = [x]
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        sources = [feats[i] for i in self.lateral_from]
        target_hw = sources[0].shape[-2:]
        neck = None
        for lat, f in zip(self.laterals, sources):
            y = lat(f)
            if y.shape[-2:] != target_hw:
                y = F.interpolate(y, size=target_hw, mode="nearest")
            neck = y if neck is None else neck + y
        h = self.head_blocks(self.fuse(neck))
        reg = self.regression(h)
        out = {"heatmap": self.heatmap(h)}
        start = 0
        for name, n in self.outputs:
            out[name] = reg[:, start : start + n]
            start += n
        return out


def fuse_batchnorm(model: nn.Module) -> nn.Module:
    """Fold every Conv2d+BatchNorm2d pair into the conv, in place (inference only; faster on CPU)."""
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            mods = list(module)
            for i in range(len(mods) - 1):
                conv, bn = mods[i], mods[i + 1]
                if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                    w = conv.weight
                    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
                    fused = nn.Conv2d(
                        conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=True
                    ).to(w.device)
                    with torch.no_grad():
                        fused.weight.copy_(w * scale[:, None, None, None])
                        fused.bias.copy_((bias - bn.running_mean) * scale + bn.bias)
                    module[i] = fused
                    module[i + 1] = nn.Identity()
    return model


def build_model(cfg: ModelConfig) -> BevDetector:
    return BevDetector(cfg)
