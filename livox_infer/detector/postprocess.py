"""From head maps to boxes: static-shape top-k decoding (compilable), then thresholds + rotated NMS."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livox_infer.detector.boxes import axis_angle, rotated_nms
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.network import BevDetector, build_model, fuse_batchnorm
from livox_infer.detector.box_coding import decode_boxes


def topk_decode(heads: dict[str, torch.Tensor], cfg: ModelConfig, k: int | None = None):
    """Peaks of the heatmap (3x3 max-pool) -> fixed k candidates per frame.

    Returns scores (B, k), labels (B, k) int64, boxes (B, k, 7) in the voxelizer frame. Shapes do
    not depend on the data, so this part compiles and graph-captures together with the network.
    With an ``iou`` head map and ``cfg.iou_score_alpha`` > 0 the score of a candidate becomes
    heat^(1 - a) * iou^a (a per class); candidates are still chosen by heat.
    """
    heat = torch.sigmoid(heads["heatmap"])
    b, c, h, w = heat.shape
    k = min(k or cfg.top_k, c * h * w)  # a small grid (one 3.2 m cell of lite) has fewer places than top_k
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
    if "iou" in heads and any(cfg.iou_score_alpha):
        alpha = scores.new_tensor(cfg.iou_score_alpha)[labels]
        iou = torch.sigmoid(gather("iou")[..., 0])
        scores = scores.pow(1.0 - alpha) * iou.pow(alpha)
    return scores, labels, boxes


def check_flip_symmetric(cfg: ModelConfig) -> None:
    """Test-time flipping mirrors the BEV rows (y): the grid must be symmetric about y = 0."""
    from livox_infer.errors import ConfigError

    g = cfg.grid
    if abs(g.y_range[0] + g.y_range[1]) > 1e-6 or g.height % cfg.out_stride:
        raise ConfigError(f"test-time flip needs a grid symmetric about y = 0 (y_range {list(g.y_range)})")


def mirror_bev(bev: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The BEV tensor of the cloud mirrored in y (y -> -y; the grid is symmetric about y = 0): rows
    reversed, and the sub-cell y position channel (if the grid has it) becomes 1 - value in occupied
    cells (within one 1/256 step of voxelizing the mirrored cloud)."""
    mirrored = bev.flip(-2)
    if not cfg.grid.xy_offsets:
        return mirrored
    y = cfg.grid.channel_names.index("y_offset_mean")
    occupied = mirrored[:, 0:1] > 0  # log_count
    y_mirrored = torch.where(occupied, 1.0 - mirrored[:, y : y + 1], torch.zeros_like(mirrored[:, y : y + 1]))
    return torch.cat([mirrored[:, :y], y_mirrored, mirrored[:, y + 1 :]], dim=1)


def merge_flipped(heads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Batch [frame, frame mirrored in y] of head maps -> one frame's maps, the mean of both views.

    The mirrored view is flipped back along the rows; its sub-cell y offset becomes 1 - offset (the
    centre at row r + o in the mirror is at H - r - o here, i.e. row H-1-r plus 1 - o) and
    sin(2 yaw) changes sign (yaw -> -yaw). Heat is averaged as probabilities."""
    direct = {k: v[0:1] for k, v in heads.items()}
    mirror = {k: v[1:2].flip(-2) for k, v in heads.items()}
    prob = 0.5 * (torch.sigmoid(direct["heatmap"]) + torch.sigmoid(mirror["heatmap"]))
    sign = direct["offset"].new_tensor([1.0, -1.0])[None, :, None, None]
    shift = direct["offset"].new_tensor([0.0, 1.0])[None, :, None, None]
    merged = {
        "heatmap": torch.logit(prob.clamp(1e-6, 1 - 1e-6)),
        "offset": 0.5 * (direct["offset"] + shift + sign * mirror["offset"]),
        "z": 0.5 * (direct["z"] + mirror["z"]),
        "size": 0.5 * (direct["size"] + mirror["size"]),
        "yaw": 0.5 * (direct["yaw"] - sign * mirror["yaw"]),  # [sin 2yaw, cos 2yaw] * (-1, +1)
    }
    if "iou" in heads:  # mirror-invariant, averaged as logits
        merged["iou"] = 0.5 * (direct["iou"] + mirror["iou"])
    return merged


class InferenceModel(nn.Module):
    """Network + top-k decoding: (1, C, H, W) -> scores (k,), labels (k,), boxes (k, 7). Static shapes.

    ``flip``: test-time augmentation: the frame and its mirror image (y -> -y) go through the network
    as a batch of two and their head maps are averaged (`merge_flipped`); ~2x network time.
    ``amp_dtype``: run the backbone and neck under autocast to this dtype (bf16 on AMX CPUs,
    `livox_infer.detector.precision`); the head and the decoding stay fp32."""

    def __init__(self, net: BevDetector, cfg: ModelConfig, flip: bool = False,
                 amp_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if flip:
            check_flip_symmetric(cfg)
        self.net = net
        self.cfg = cfg
        self.flip = bool(flip)
        self.amp_dtype = amp_dtype

    def _heads(self, bev: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.amp_dtype is None:
            return self.net(bev)
        with torch.autocast(device_type=bev.device.type, dtype=self.amp_dtype):
            features = self.net.neck(self.net.backbone(bev))
        return self.net.head(features.float())

    def forward(self, bev: torch.Tensor):
        if self.flip:
            heads = merge_flipped(self._heads(torch.cat([bev, mirror_bev(bev, self.cfg)])))
        else:
            heads = self._heads(bev)
        scores, labels, boxes = topk_decode(heads, self.cfg)
        return scores[0], labels[0], boxes[0]


def build_inference_model(cfg: ModelConfig, weights, device: torch.device, flip: bool = False,
                          precision: str = "fp32") -> tuple[InferenceModel, dict[str, str]]:
    """Eval-mode network + decoding with BatchNorm folded, channels_last, on ``device``, and the weights'
    metadata: what the pipeline runs and what `livox-infer export` compiles. ``precision``: a resolved one
    ("fp32" | "bf16", `livox_infer.detector.precision.resolve_precision`)."""
    from livox_infer.detector.precision import amp_dtype
    from livox_infer.detector.weights import load_weights

    net = build_model(cfg)
    meta = load_weights(net, cfg, weights)
    net.eval()
    fuse_batchnorm(net)
    infer = InferenceModel(net, cfg, flip=flip, amp_dtype=amp_dtype(precision))
    infer = infer.to(device).to(memory_format=torch.channels_last).eval()
    # inference: no gradients. It also keeps autocast's cache of bf16 weight casts (one map behind a mutex, filled only
    # for tensors that require grad) empty: clearing a filled one at autocast's exit needed the GIL under that mutex,
    # which deadlocked eager bf16 frames against torch.compile tracing the network in the background thread
    infer.requires_grad_(False)
    return infer, meta


def select_detections(
    scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, score_thresholds, nms_iou, max_detections: int,
    cross_class_iou: float | None = None, paired_area=None,
):
    """Per-class score thresholds, then rotated-BEV NMS (class-wise, plus cross-class when given).
    Inputs (k,), (k,), (k, 7). ``paired_area``: a package's compiled overlap clipping (`rotated_nms`)."""
    thr = torch.as_tensor(score_thresholds, dtype=scores.dtype, device=scores.device)
    keep = scores >= thr[labels]
    scores, labels, boxes = scores[keep], labels[keep], boxes[keep]
    idx = rotated_nms(boxes, scores, labels, list(nms_iou), max_detections, cross_class_iou, paired_area)
    boxes = boxes[idx].clone()
    boxes[:, 6] = axis_angle(boxes[:, 6])
    return scores[idx], labels[idx], boxes


def select_detections_and_candidates(
    scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, score_thresholds, candidate_score: float,
    nms_iou, max_detections: int, cross_class_iou: float | None = None, paired_area=None,
):
    """`select_detections`, and beside them the boxes scoring in [candidate_score, their class's threshold) that the
    same NMS keeps: ((scores, labels, boxes) of the detections, the same of the candidates). One NMS in which every box
    above its threshold goes before every candidate, so the detections are exactly `select_detections`' (a candidate
    of one class never suppresses a detection of another) and the NMS runs once."""
    thr = torch.as_tensor(score_thresholds, dtype=scores.dtype, device=scores.device)[labels]
    keep = scores >= torch.clamp(thr, max=float(candidate_score))
    scores, labels, boxes, thr = scores[keep], labels[keep], boxes[keep], thr[keep]
    above = scores >= thr
    priority = scores + 2.0 * above.to(scores.dtype)  # scores lie in [0, 1]: the detections sort first
    idx = rotated_nms(boxes, priority, labels, list(nms_iou), max_detections, cross_class_iou, paired_area)
    boxes = boxes[idx].clone()
    boxes[:, 6] = axis_angle(boxes[:, 6])
    scores, labels, det = scores[idx], labels[idx], above[idx]
    return (scores[det], labels[det], boxes[det]), (scores[~det], labels[~det], boxes[~det])
