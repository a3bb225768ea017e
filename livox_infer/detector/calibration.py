"""Score calibration: a per-class monotone map from the network's score to the share of such boxes that are
right, fitted on cross-validated real detections (`livox_infer.evaluation.calibration`).

The model config's ``score_calibration`` gives, per class, knots ``[[raw, calibrated], ...]`` with both
columns non-decreasing; scores between knots are interpolated linearly, beyond the ends held at the end
values. A class without knots keeps its raw score. The pipeline applies it after the refiner and before the
operating thresholds, so thresholds are in calibrated units ("keep boxes that are right >= t of the time")."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError

Knots = tuple[tuple[float, float], ...]


def parse_calibration(value: Any, classes: Sequence[str], source: str = "") -> tuple[Knots | None, ...] | None:
    """The config's ``score_calibration`` mapping -> one knot tuple (or None) per class; None when absent."""
    if value is None:
        return None
    # entries for known classes the model does not have are ignored (a three-class config on a five-class base)
    if not isinstance(value, dict) or set(value) - set(classes) - set(CLASS_NAMES):
        raise ConfigError(f"model config {source}: score_calibration must map classes {list(classes)} to "
                          f"[[raw, calibrated], ...], got keys {sorted(value) if isinstance(value, dict) else value!r}")
    out: list[Knots | None] = []
    for c in classes:
        knots = value.get(c)
        if knots is None:
            out.append(None)
            continue
        try:
            pairs = tuple((float(a), float(b)) for a, b in knots)
        except (TypeError, ValueError):
            raise ConfigError(f"model config {source}: score_calibration.{c} must be [[raw, calibrated], ...]") from None
        ok = len(pairs) >= 2 and all(0.0 <= v <= 1.0 and math.isfinite(v) for p in pairs for v in p)
        ok = ok and all(b[0] > a[0] and b[1] >= a[1] for a, b in zip(pairs, pairs[1:]))
        if not ok:
            raise ConfigError(f"model config {source}: score_calibration.{c} needs >= 2 knots in [0, 1], raw "
                              "increasing and calibrated non-decreasing")
        out.append(pairs)
    return tuple(out)


def calibration_tables(knots: Sequence[Knots | None], device=None) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    return [None if k is None else (torch.tensor([a for a, _ in k], device=device),
                                    torch.tensor([b for _, b in k], device=device)) for k in knots]


def interp(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation through (xs, ys), held constant beyond the ends (numpy.interp)."""
    xs, ys = xs.to(x.dtype), ys.to(x.dtype)
    i = torch.searchsorted(xs, x.clamp(xs[0], xs[-1]).contiguous(), right=True).clamp(1, xs.numel() - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    t = ((x.clamp(xs[0], xs[-1]) - x0) / (x1 - x0)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


def calibrate_scores(scores: torch.Tensor, labels: torch.Tensor, tables) -> torch.Tensor:
    """Scores mapped through their class's table (`calibration_tables`); classes without one unchanged."""
    out = scores.clone()
    for c, table in enumerate(tables):
        if table is None:
            continue
        m = labels == c
        if bool(m.any()):
            out[m] = interp(scores[m], *table)
    return out
