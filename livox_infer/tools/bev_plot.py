"""Bird's-eye-view pictures of a cloud with detected (and labelled) boxes, for `detect --bev-png`, the demo
and the real-scan evaluation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from livox_infer.colors import CLASS_COLORS, class_color
from livox_infer.detector.boxes import box_corners

UNLABELLED_GREY = "0.6"  # ignored ground truth (too few points)


def _outline(box: np.ndarray) -> np.ndarray:
    """Closed BEV outline (5, 2) of a box."""
    c = box_corners(box)[:4, :2]
    return np.vstack([c, c[:1]])


def save_bev_png(path: Path, points: np.ndarray, boxes: np.ndarray, names: list[str], scores: np.ndarray,
                 extent: tuple[float, float, float, float], title: str = "", gt=None) -> None:
    """Points (grey, darker = higher) and boxes (class colour from livox_infer.colors, the RViz markers' colours;
    heading tick; "class score" on a white label) seen from above, with a legend of the classes.

    ``gt`` = (boxes, names, ignored) adds labelled boxes, dashed (grey where ignored)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x0, x1, y0, y1 = extent
    fig, ax = plt.subplots(figsize=(7, 7), dpi=100)
    sel = (points[:, 0] >= x0) & (points[:, 0] <= x1) & (points[:, 1] >= y0) & (points[:, 1] <= y1)
    p = points[sel]
    # grey points, so the class colours stand out (a coloured height map hid green and blue boxes)
    lo = np.percentile(p[:, 2], 2) if len(p) else 0.0
    hi = np.percentile(p[:, 2], 98) if len(p) else 1.0
    ax.scatter(p[:, 1], p[:, 0], s=0.3, c=p[:, 2], cmap="Greys", vmin=lo - 0.5 * (hi - lo), vmax=hi, linewidths=0)
    if gt is not None:
        for box, name, ignored in zip(*gt):
            c = _outline(box)
            ax.plot(c[:, 1], c[:, 0], color=UNLABELLED_GREY if ignored else class_color(name), lw=0.9, ls="--")
    for box, name, score in zip(boxes, names, scores):
        c = _outline(box)
        color = class_color(name)
        ax.plot(c[:, 1], c[:, 0], color=color, lw=1.4)
        head = box[:2] + 0.5 * box[3] * np.array([math.cos(box[6]), math.sin(box[6])])
        ax.plot([box[1], head[1]], [box[0], head[0]], color=color, lw=1.2)
        ax.text(box[1], box[0] + 0.6 * box[3], f"{name} {score:.2f}", fontsize=7, color="black", ha="center",
                va="bottom", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec=color, lw=0.8, alpha=0.85))
    ax.legend(handles=legend_handles(gt is not None), loc="upper right", fontsize=7, framealpha=0.9)
    ax.set_xlim(y1, y0)  # y to the left, as seen from above with x up
    ax.set_ylim(x0, x1)
    ax.set_aspect("equal")
    ax.set_xlabel("y [m]")
    ax.set_ylabel("x [m]")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def legend_handles(with_labels: bool = False) -> list:
    """Legend entries: one line per class of livox_infer.colors (solid = detected), plus dashed = labelled."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=rgba, lw=1.6, label=name) for name, rgba in CLASS_COLORS.items()]
    if with_labels:
        handles.append(Line2D([], [], color="black", lw=1.0, ls="--", label="labelled (dashed)"))
        handles.append(Line2D([], [], color=UNLABELLED_GREY, lw=1.0, ls="--", label="labelled, ignored"))
    return handles
