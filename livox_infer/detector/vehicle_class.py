"""Truck or bus: a small classifier on the side view of the points in each truck / bus candidate's box.

Stage 1 and the refiners place trucks and buses well but mix the two up (the second refiner scores a box nearly
the same under either label: it cannot tell them apart from 64 sampled points and the box). What separates them is
the profile along the body: a truck's cab is lower and shorter than its cargo box, a bus's roof runs level end to
end with a band of windows (few returns) along its sides. The classifier reads that profile from a grid over the box
seen from its side (share of the box's points per length x height cell, the top height per length bin), the box's
size, and how high the sensor can see at the box (`view_ceiling`: a 64-beam sensor 1.7 m up sees nothing above
~2.6 m at 26 m, so a 4 m trailer's side looks as low as a bus's), and relabels the candidate; the box and its score
stay. Its members are small MLPs whose bus probabilities are averaged over both ends of the box (a box's heading may
point either way) and over the members.

A model config turns it on with a `vehicle_classifier` section. The shipped lite config has none: trained on simulated
trucks and buses, it called real_dev's real trucks buses (docs/detector.md, docs/training.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from livox_infer.errors import ConfigError

# candidates classified at once: bounds the (candidates x nearby points) working set of one frame
CHUNK = 16
# metres above a box's bottom the sensor sees up to where it cannot be told (no sensor height) or lies higher
OPEN_CEILING_M = 8.0


@dataclass(frozen=True)
class VehicleClassConfig:
    """The ``vehicle_classifier`` section of a model config. ``classes``: the two classes it decides between
    (the first where its bus-probability output is below 0.5)."""

    classes: tuple[str, str] = ("truck", "bus")
    length_bins: int = 12
    height_bins: int = 9
    height_step: float = 0.5  # metres per height bin, from the box's bottom
    margin: float = 0.5  # metres added to the box's length and width
    hidden: int = 64
    members: int = 5

    @property
    def num_features(self) -> int:
        return self.length_bins * self.height_bins + self.length_bins + 6

    def architecture(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "length_bins": self.length_bins, "height_bins": self.height_bins,
                "height_step": self.height_step, "margin": self.margin, "hidden": self.hidden,
                "members": self.members}

    def to_dict(self) -> dict[str, Any]:
        return self.architecture()


def parse_vehicle_classifier(section: Any, classes: tuple[str, ...], source: str) -> VehicleClassConfig | None:
    """The config section (None / absent: no classifier)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"model config {source}: vehicle_classifier must be a mapping, got {section!r}")
    defaults = VehicleClassConfig()
    unknown = sorted(set(section) - set(defaults.to_dict()))
    if unknown:
        raise ConfigError(f"model config {source}: unknown vehicle_classifier keys {unknown}; "
                          f"known: {sorted(defaults.to_dict())}")
    pair = tuple(section.get("classes", defaults.classes))
    if len(pair) != 2 or len(set(pair)) != 2 or not set(pair) <= set(classes):
        raise ConfigError(f"model config {source}: vehicle_classifier.classes must be two of the model's classes "
                          f"{list(classes)}, got {list(pair)}")
    ints = {}
    for k in ("length_bins", "height_bins", "hidden", "members"):
        v = section.get(k, getattr(defaults, k))
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1024:
            raise ConfigError(f"model config {source}: vehicle_classifier.{k} must be an integer in 1..1024, got {v!r}")
        ints[k] = v
    floats = {}
    for k, lo, hi in (("height_step", 0.05, 2.0), ("margin", 0.0, 5.0)):
        v = section.get(k, getattr(defaults, k))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
            raise ConfigError(f"model config {source}: vehicle_classifier.{k} must be a number in [{lo}, {hi}], "
                              f"got {v!r}")
        floats[k] = float(v)
    return VehicleClassConfig(classes=pair, **ints, **floats)


def view_ceiling(points: torch.Tensor, boxes: torch.Tensor, sensor_height: float | None) -> torch.Tensor:
    """(K,) metres above each box's bottom that the sensor sees at the box's range: the cloud's steepest upward
    ray (its 99.9th percentile, from the sensor at ``sensor_height`` over the levelled frame's origin) carried to
    the box's centre. OPEN_CEILING_M where there is no sensor height or too few points to tell."""
    b = boxes.float()
    out = torch.full((b.shape[0],), OPEN_CEILING_M, device=b.device)
    if sensor_height is None or points.shape[0] < 100 or not math.isfinite(float(sensor_height)):
        return out
    p = points[:, :3].float()
    r = torch.hypot(p[:, 0], p[:, 1])
    far = r > 3.0
    if int(far.sum()) < 100:
        return out
    slope = torch.quantile((p[far, 2] - float(sensor_height)) / r[far], 0.999)
    ceiling = float(sensor_height) + torch.hypot(b[:, 0], b[:, 1]) * slope - (b[:, 2] - b[:, 5] / 2)
    return torch.clamp(ceiling, 0.0, OPEN_CEILING_M)


def side_view_features(points: torch.Tensor, boxes: torch.Tensor, cfg: VehicleClassConfig,
                       reverse: bool = False, ceiling: torch.Tensor | None = None) -> torch.Tensor:
    """(K, cfg.num_features) features of ``boxes`` (K, 7) from ``points`` (N, >= 3, the levelled cloud or the
    points near the boxes): the share of the box's points in each (length bin, height bin) cell of its side view,
    the top point height per length bin, the box's length, width and height, its point count and range, and the
    `view_ceiling` (K,) (None: OPEN_CEILING_M). ``reverse``: the length axis read from the other end. Points count
    from 0.15 m above the box's bottom (not the ground under it) to ``height_bins * height_step``, within
    ``margin`` of its sides."""
    nl, nh, step = cfg.length_bins, cfg.height_bins, cfg.height_step
    k = boxes.shape[0]
    b = boxes.float()
    p = points[:, :3].float()
    c, s = torch.cos(b[:, 6:7]), torch.sin(b[:, 6:7])
    dx = p[None, :, 0] - b[:, 0:1]
    dy = p[None, :, 1] - b[:, 1:2]
    u = c * dx + s * dy  # (K, N) along the box
    v = c * dy - s * dx  # across
    up = p[None, :, 2] - (b[:, 2:3] - b[:, 5:6] / 2)  # above the box's bottom
    half_l = b[:, 3:4] / 2 + cfg.margin
    half_w = b[:, 4:5] / 2 + cfg.margin
    inside = (u.abs() < half_l) & (v.abs() < half_w) & (up > 0.15) & (up < nh * step)
    iu = ((u / half_l + 1.0) * (nl / 2)).floor().clamp(0, nl - 1).long()
    if reverse:
        iu = nl - 1 - iu
    ih = (up / step).floor().clamp(0, nh - 1).long()
    row = torch.arange(k, device=b.device)[:, None].expand_as(iu)
    column = row * nl + iu
    counts = torch.bincount(((column * nh) + ih)[inside], minlength=k * nl * nh).view(k, nl * nh).float()
    total = counts.sum(1)
    top = torch.zeros(k * nl, device=b.device).scatter_reduce(0, column[inside], up[inside], "amax",
                                                              include_self=True).view(k, nl)
    if ceiling is None:
        ceiling = torch.full((k,), OPEN_CEILING_M, device=b.device)
    size = torch.stack([b[:, 3] / 10, b[:, 4] / 2.5, b[:, 5] / 3, torch.log1p(total) / 6,
                        torch.hypot(b[:, 0], b[:, 1]) / 50, ceiling.float() / 4], 1)
    return torch.cat([counts / total.clamp(min=1)[:, None] * 10, top / 4, size], 1)


class VehicleClassifier(nn.Module):
    """``members`` small MLPs (features -> hidden -> hidden -> bus logit), evaluated as one batch."""

    def __init__(self, cfg: VehicleClassConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        self.dropout = dropout  # training only
        e, f, h = cfg.members, cfg.num_features, cfg.hidden
        self.w1 = nn.Parameter(torch.empty(e, f, h))
        self.b1 = nn.Parameter(torch.zeros(e, 1, h))
        self.w2 = nn.Parameter(torch.empty(e, h, h))
        self.b2 = nn.Parameter(torch.zeros(e, 1, h))
        self.w3 = nn.Parameter(torch.empty(e, h, 1))
        self.b3 = nn.Parameter(torch.zeros(e, 1, 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fresh weights (each member as an nn.Linear initialises itself), zero biases."""
        with torch.no_grad():
            for w in (self.w1, self.w2, self.w3):
                bound = 1.0 / w.shape[1] ** 0.5
                nn.init.uniform_(w, -bound, bound)
            for b in (self.b1, self.b2, self.b3):
                nn.init.zeros_(b)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(E, K, F) features (one batch per member) or (K, F) (the same for all) -> (E, K) bus logits."""
        x = features if features.dim() == 3 else features.expand(self.cfg.members, *features.shape)
        drop = self.dropout if self.training else 0.0
        x = nn.functional.dropout(torch.relu(torch.baddbmm(self.b1, x, self.w1)), drop, self.training)
        x = nn.functional.dropout(torch.relu(torch.baddbmm(self.b2, x, self.w2)), drop, self.training)
        return torch.baddbmm(self.b3, x, self.w3)[..., 0]

    @torch.no_grad()
    def probability(self, both_ends: torch.Tensor) -> torch.Tensor:
        """(K,) probability of the second class from (2, K, F) features read from either end: averaged over both
        ends and the members."""
        return sum(torch.sigmoid(self(both_ends[r])).mean(0) for r in range(2)) / 2

    @torch.no_grad()
    def bus_probability(self, points: torch.Tensor, boxes: torch.Tensor,
                        ceiling: torch.Tensor | None = None) -> torch.Tensor:
        """(K,) `probability` of each box's features; ``ceiling``: `view_ceiling` (K,) or None."""
        out = []
        for i in range(0, boxes.shape[0], CHUNK):
            chunk = boxes[i:i + CHUNK]
            c = None if ceiling is None else ceiling[i:i + CHUNK]
            out.append(self.probability(torch.stack([side_view_features(points, chunk, self.cfg, reverse, c)
                                                     for reverse in (False, True)])))
        return torch.cat(out) if out else torch.zeros(0, device=boxes.device)


def relabel_vehicles(classifier: VehicleClassifier, classes: tuple[str, ...], points: torch.Tensor,
                     labels: torch.Tensor, boxes: torch.Tensor, near=None,
                     sensor_height: float | None = None) -> torch.Tensor:
    """``labels`` with every candidate of the classifier's two classes given the one it picks. ``points``: the
    levelled cloud; ``near``: ``fn(boxes) -> indices of the points near them`` (a prefilter; None: all points);
    ``sensor_height``: the sensor's height over the levelled frame's origin (`view_ceiling`; None: unknown)."""
    first, second = (classes.index(c) for c in classifier.cfg.classes)
    mine = (labels == first) | (labels == second)
    if not bool(mine.any()):
        return labels
    sel = boxes[mine].float()
    ceiling = view_ceiling(points, sel, sensor_height)
    pts = points if near is None else points[near(sel)]
    p = classifier.bus_probability(pts, sel, ceiling)
    out = labels.clone()
    out[mine] = torch.where(p >= 0.5, second, first).to(labels.dtype)
    return out
