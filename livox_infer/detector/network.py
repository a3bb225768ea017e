"""The two-stage detector: stage 1 = backbone -> neck -> centre head on the BEV grid (this module's forward),
stage 2 = the RoI refiner on the points inside stage 1's best candidates (`BevDetector.refine`).

Both stages live in one module so that one weights file holds them (`livox_infer.detector.weights`).
Modules: `backbone.Backbone`, `neck.Neck`, `head.CenterHead`, `refine.RoiRefiner`.
"""

from __future__ import annotations

import torch
from torch import nn

from livox_infer.detector.backbone import Backbone
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.head import CenterHead
from livox_infer.detector.neck import Neck
from livox_infer.detector.refine import PointCells, RoiRefiner, _near_any_box, refine_candidates
from livox_infer.detector.vehicle_class import VehicleClassifier, relabel_vehicles

# Weights saved before the backbone / neck / head split name their tensors without the module prefix.
LEGACY_PREFIXES = (
    ("stem.", "backbone.stem."), ("stages.", "backbone.stages."), ("laterals.", "neck.laterals."),
    ("fuse.", "neck.fuse."), ("head_blocks.", "head.blocks."), ("heatmap.", "head.heatmap."),
    ("regression.", "head.regression."),
)


def upgrade_state_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with pre-split tensor names renamed to today's (others unchanged)."""
    out = {}
    for k, v in state.items():
        for old, new in LEGACY_PREFIXES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


class BevDetector(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg, self.backbone.strides, self.backbone.channels)
        self.head = CenterHead(cfg)
        self.refiner = RoiRefiner(cfg.refine, cfg.num_classes) if cfg.refine else None
        self.refiner_large = RoiRefiner(cfg.refine_large, cfg.num_classes) if cfg.refine_large else None
        self.vehicle_classifier = VehicleClassifier(cfg.vehicle_classifier) if cfg.vehicle_classifier else None

    def forward(self, bev: torch.Tensor) -> dict[str, torch.Tensor]:
        """Stage 1: BEV grid (B, C, H, W) -> head maps (see `livox_infer.detector.head`)."""
        return self.head(self.neck(self.backbone(bev)))

    def refine(self, points: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor,
               intensity_scale: float, passes: int | None = None, sensor_height: float | None = None,
               classify: bool = True):
        """Stage 2 on one frame's levelled points and stage-1 candidates (`refine_candidates`): the refiner for its
        classes, then ``refiner_large`` (its own passes; compiled from a package, else eager) for its classes; the
        others pass both unchanged. Then the ``vehicle_classifier`` (eager) picks truck or bus for those
        candidates (`vehicle_class.relabel_vehicles`; ``sensor_height``: the sensor's height over the levelled
        frame's origin, which tells it how high the sensor sees); boxes and scores stay. ``classify=False`` skips
        the classifier (its own training collects the candidates before it)."""
        # the cloud's coarse cells, built once for both refiners and the classifier (0.6 ms a 24k-point frame)
        classifier = self.vehicle_classifier if classify else None
        shared = self.refiner_large is not None or classifier is not None
        cells = PointCells(points.float()) if shared else None
        out = refine_candidates(self.refiner, self.cfg.refine, self.cfg.num_classes, points, scores, labels, boxes,
                                intensity_scale, passes=passes, compiled=self.compiled_refiner, cells=cells)
        if self.refiner_large is not None:
            out = refine_candidates(self.refiner_large, self.cfg.refine_large, self.cfg.num_classes, points, *out,
                                    intensity_scale, compiled=self.compiled_refiner_large, cells=cells)
        if classifier is not None:
            s, l, b = out
            margin = self.cfg.vehicle_classifier.margin
            l = relabel_vehicles(classifier, self.cfg.classes, points, l, b,
                                 near=lambda sel: _near_any_box(points, sel, margin, cells=cells),
                                 sensor_height=sensor_height)
            out = (s, l, b)
        return out

    compiled_refiner = None  # refine.CompiledRefiner once the pipeline compiles stage 2 (`compile_refiner`), or aoti.PackageStage2
    compiled_refiner_large = None  # aoti.PackageStage2 of refiner_large's whole pass (a package's, format v4)

    def compile_refiner(self) -> None:
        """Run stage 2's costly parts torch.compile'd from now on (they compile at their first call)."""
        from livox_infer.detector.refine import CompiledRefiner

        if self.refiner is not None:
            self.compiled_refiner = CompiledRefiner(self.refiner, self.cfg.refine)


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
