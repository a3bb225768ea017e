"""Bird's-eye-view pictures of a cloud with detected (and labelled) boxes, for `detect --bev-png`, the demo
and the real-scan evaluation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from livox_infer.detector.boxes import box_corners


CLASS_COLORS = {"car": "tab:red", "pedestrian": "tab:green", "cyclist": "tab:blue"}


def _outline(box: np.ndarray) -> np.ndarray:
    """Closed BEV outline (5, 2) of a box."""
    c = box_corners(box)[:4, :2]
    return np.vstack([c, c[:1]])


def save_bev_png(path: Path, points: np.ndarray, boxes: np.ndarray, names: list[str], scores: np.ndarray,
                 extent: tuple[float, float, float, float], title: str = "", gt=None) -> None:
    """Points (coloured by height) and boxes (class colour, heading tick, "cls score") seen from above.

    ``gt`` = (boxes, names, ignored) adds labelled boxes, dashed (grey where ignored)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x0, x1, y0, y1 = extent
    fig, ax = plt.subplots(figsize=(7, 7), dpi=100)
    sel = (points[:, 0] >= x0) & (points[:, 0] <= x1) & (points[:, 1] >= y0) & (points[:, 1] <= y1)
    p = points[sel]
    ax.scatter(p[:, 1], p[:, 0], s=0.3, c=p[:, 2], cmap="viridis", vmin=np.percentile(p[:, 2], 2) if len(p) else 0,
               vmax=np.percentile(p[:, 2], 98) if len(p) else 1, linewidths=0)
    if gt is not None:
        for box, name, ignored in zip(*gt):
            c = _outline(box)
            ax.plot(c[:, 1], c[:, 0], color="0.6" if ignored else CLASS_COLORS.get(name, "black"), lw=0.9, ls="--")
    for box, name, score in zip(boxes, names, scores):
        c = _outline(box)
        color = CLASS_COLORS.get(name, "black")
        ax.plot(c[:, 1], c[:, 0], color=color, lw=1.2)
        head = box[:2] + 0.5 * box[3] * np.array([math.cos(box[6]), math.sin(box[6])])
        ax.plot([box[1], head[1]], [box[0], head[0]], color=color, lw=1.0)
        ax.text(box[1], box[0], f"{name[:3]} {score:.2f}", fontsize=6, color=color)
    ax.set_xlim(y1, y0)  # y to the left, as seen from above with x up
    ax.set_ylim(x0, x1)
    ax.set_aspect("equal")
    ax.set_xlabel("y [m]")
    ax.set_ylabel("x [m]")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
