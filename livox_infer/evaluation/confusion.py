"""What became of each labelled object (`livox-infer eval --confusion`): boxed right, boxed well but called
another class, boxed poorly, or not boxed at all, per class.

AP mixes these; they call for different fixes (a class mix-up, e.g. trucks reported as buses, is not a
localisation error and not a miss). An object (not ignored) is

- *right*: a detection of its class at BEV IoU >= its class's loose threshold (car / truck / bus 0.5, pedestrian /
  cyclist 0.25; `metrics.IOU_THRESHOLDS`), as AP counts it;
- *called X*: otherwise, a detection of class X overlaps it at that IoU (the highest-IoU one names X);
- *poorly placed*: otherwise, some detection overlaps it at BEV IoU >= ``POOR_IOU`` (any class);
- *no box*: nothing overlaps it that much.

Per object, not a one-to-one assignment: one detection may cover two objects. The detections are those the AP
ranking keeps (down to --score-threshold).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from livox_infer.detector.boxes import bev_iou
from livox_infer.evaluation.metrics import IOU_THRESHOLDS, FrameBoxes

POOR_IOU = 0.1


def object_outcomes(dets: Sequence[FrameBoxes], gts: Sequence[FrameBoxes], gt_ignore: Sequence[np.ndarray],
                    classes: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per labelled class: counts of 'objects', 'right', 'called <class>' (one key per other class met),
    'poorly placed' and 'no box' (see the module doc)."""
    out: dict[str, dict[str, int]] = {c: {"objects": 0, "right": 0, "poorly placed": 0, "no box": 0} for c in classes}
    for d, g, ign in zip(dets, gts, gt_ignore):
        keep = ~np.asarray(ign, bool) & (g.labels >= 0) & (g.labels < len(classes))
        if not keep.any():
            continue
        gb = g.boxes[keep]
        iou = (bev_iou(torch.from_numpy(gb), torch.from_numpy(d.boxes)).numpy() if len(d.boxes)
               else np.zeros((len(gb), 0), np.float32))
        for row, k in zip(iou, g.labels[keep]):
            c = classes[int(k)]
            thr = IOU_THRESHOLDS.get(c, (0.5, 0.25))[1]
            counts = out[c]
            counts["objects"] += 1
            mine = d.labels == k
            if mine.any() and row[mine].max() >= thr:
                counts["right"] += 1
            elif len(row) and row.max() >= thr:
                other = f"called {classes[int(d.labels[int(np.argmax(row))])]}"
                counts[other] = counts.get(other, 0) + 1
            elif len(row) and row.max() >= POOR_IOU:
                counts["poorly placed"] += 1
            else:
                counts["no box"] += 1
    return out


def confusion_table(res: dict[str, dict[str, int]], title: str) -> str:
    """One row per labelled class with objects: how many, right, called each other class, poorly placed, no box."""
    called = [f"called {c}" for c in res if any(f"called {c}" in r for r in res.values())]
    cols = ["objects", "right", *called, "poorly placed", "no box"]
    widths = [max(9, len(k) + 2) for k in cols]
    head = f"{'class':<11}" + "".join(f"{k:>{w}}" for k, w in zip(cols, widths))
    lines = [title, head, "-" * len(head)]
    for c, r in res.items():
        if r["objects"]:
            lines.append(f"{c:<11}" + "".join(f"{r.get(k, 0):>{w}}" for k, w in zip(cols, widths)))
    return "\n".join(lines)


def confusion_report(dets: Sequence[FrameBoxes], gts: Sequence[FrameBoxes], gt_ignore: Sequence[np.ndarray],
                     classes: Sequence[str], what: str) -> dict[str, Any]:
    """Print the table and return it (for --out)."""
    res = object_outcomes(dets, gts, gt_ignore, classes)
    print(confusion_table(res, f"== labelled objects on {what}: right / boxed well as another class / poorly placed "
                               f"(BEV IoU >= {POOR_IOU:g}) / no box (right: BEV IoU >= 0.5 car, truck, bus; 0.25 "
                               "pedestrian, cyclist) =="))
    return res
