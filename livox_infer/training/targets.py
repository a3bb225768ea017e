"""Training targets: gaussian centre heatmaps + regression at the centre cells.

The box encoding (offset, z, log size, doubled-angle yaw) is defined, with its inverse, in
`livox_infer.detector.box_coding`; boxes -> targets -> decode gives the boxes back (the round-trip test).
"""

from __future__ import annotations

import math

import numpy as np

from livox_infer.detector.config import ModelConfig



def gaussian_radius(length_cells: float, width_cells: float, min_overlap: float) -> float:
    """CenterNet's radius: the largest centre shift that keeps IoU >= min_overlap (the min of 3 cases)."""
    h, w = length_cells, width_cells
    b1 = h + w
    c1 = w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(max(b1 * b1 - 4 * c1, 0.0))) / 2
    b2 = 2 * (h + w)
    c2 = (1 - min_overlap) * w * h
    r2 = (b2 + math.sqrt(max(b2 * b2 - 16 * c2, 0.0))) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (h + w)
    c3 = (min_overlap - 1) * w * h
    r3 = (b3 + math.sqrt(max(b3 * b3 - 4 * a3 * c3, 0.0))) / 2
    return min(r1, r2, r3)


def draw_gaussian(heatmap: np.ndarray, col: int, row: int, radius: int) -> None:
    """Max-splat a gaussian (sigma = diameter / 6) centred on (row, col) into heatmap (H, W), in place."""
    diameter = 2 * radius + 1
    sigma = diameter / 6.0
    ys, xs = np.ogrid[-radius : radius + 1, -radius : radius + 1]
    g = np.exp(-(xs * xs + ys * ys) / (2 * sigma * sigma))
    h, w = heatmap.shape
    left, right = min(col, radius), min(w - col, radius + 1)
    top, bottom = min(row, radius), min(h - row, radius + 1)
    if left + right <= 0 or top + bottom <= 0:
        return
    region = heatmap[row - top : row + bottom, col - left : col + right]
    patch = g[radius - top : radius + bottom, radius - left : radius + right]
    np.maximum(region, patch, out=region)


def build_targets(boxes: np.ndarray, labels: np.ndarray, cfg: ModelConfig,
                  neighbour_weight: float = 0.0) -> dict[str, np.ndarray]:
    """Targets for one frame. ``boxes`` (M, 7) with z relative to the ground (the voxelizer's frame).

    Returns heatmap (K, h, w) f32, index (E,) int64 flat head-cell index, mask (E,) f32 (the entry's
    loss weight, 0 = unused), regression (E, 8) f32 [off_x, off_y, z, log l, log w, log h, sin 2yaw,
    cos 2yaw], label (E,) int64, with E = max_objects, or 9 * max_objects when ``neighbour_weight`` > 0:
    then the 8 cells around each centre cell also regress the box (offset measured from that cell,
    weight ``neighbour_weight``), so a heatmap peak one cell off still decodes the right box (with
    0.8 m head cells this happens often). Cells that are some box's centre cell keep that box.
    Boxes whose centre lies outside the grid get no target.

    Boxes with a negative label are *ignored* objects (a truck when there is no truck class, a bicycle
    without rider, a real label's object outside the view): no target, and ``ignore`` (h, w) f32 marks
    the head cells their footprint covers, where the heatmap's negative loss is switched off, so the
    network is neither taught that such an object is background nor that it is one of ours.
    """
    hh, hw = cfg.head_shape
    cell = cfg.head_cell_size
    x0, y0 = cfg.grid.x_range[0], cfg.grid.y_range[0]
    k = cfg.max_objects * (9 if neighbour_weight > 0 else 1)
    heatmap = np.zeros((cfg.num_classes, hh, hw), np.float32)
    index = np.zeros(k, np.int64)
    mask = np.zeros(k, np.float32)
    reg = np.zeros((k, 8), np.float32)
    lab = np.zeros(k, np.int64)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 7)
    labels = np.asarray(labels, np.int64).reshape(-1)
    ignore = ignore_mask(boxes[labels < 0], cfg)
    n = 0
    # Larger objects first so that, if two centres share a cell, the nearer/larger is kept consistently.
    for i in np.argsort(-boxes[:, 3] * boxes[:, 4], kind="stable"):
        x, y, z, l, w, h, yaw = boxes[i]
        c = int(labels[i])
        if not 0 <= c < cfg.num_classes or min(l, w, h) <= 0:
            continue
        u, v = (x - x0) / cell, (y - y0) / cell
        col, row = int(math.floor(u)), int(math.floor(v))
        if not (0 <= col < hw and 0 <= row < hh):
            continue
        radius = gaussian_radius(l / cell, w / cell, cfg.gaussian_overlap)
        radius = int(max(cfg.min_radius[c], radius))
        draw_gaussian(heatmap[c], col, row, radius)
        flat = row * hw + col
        if n and np.any((index[:n] == flat) & (lab[:n] == c)):
            continue  # same class, same cell: one regression target per cell and class
        if n >= cfg.max_objects:
            continue
        index[n] = flat
        mask[n] = 1.0
        lab[n] = c
        reg[n] = (u - col, v - row, z, math.log(l), math.log(w), math.log(h), math.sin(2 * yaw), math.cos(2 * yaw))
        n += 1
    if neighbour_weight > 0:
        taken = {(int(index[i]), int(lab[i])) for i in range(n)}
        for i in range(n):
            flat, c = int(index[i]), int(lab[i])
            row, col = divmod(flat, hw)
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    r2, c2 = row + dr, col + dc
                    if (dr == 0 and dc == 0) or not (0 <= r2 < hh and 0 <= c2 < hw) or n >= k:
                        continue
                    key = (r2 * hw + c2, c)
                    if key in taken:
                        continue
                    taken.add(key)
                    index[n], mask[n], lab[n] = key[0], neighbour_weight, c
                    reg[n] = reg[i]
                    reg[n, 0] -= dc  # offset from the neighbour cell
                    reg[n, 1] -= dr
                    n += 1
    return {"heatmap": heatmap, "index": index, "mask": mask, "regression": reg, "label": lab, "ignore": ignore}


def ignore_mask(boxes: np.ndarray, cfg: ModelConfig, margin: float = 0.5) -> np.ndarray:
    """(h, w) f32: 1 at the head cells whose centre lies inside a box's BEV footprint grown by ``margin``
    metres per side (a heat peak may sit a cell off the object), else 0."""
    hh, hw = cfg.head_shape
    out = np.zeros((hh, hw), np.float32)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 7)
    if not len(boxes):
        return out
    cell = cfg.head_cell_size
    x0, y0 = cfg.grid.x_range[0], cfg.grid.y_range[0]
    for x, y, _z, l, w, _h, yaw in boxes:
        r = 0.5 * math.hypot(l, w) + margin
        c0, c1 = max(0, int((x - r - x0) / cell)), min(hw, int((x + r - x0) / cell) + 1)
        r0, r1 = max(0, int((y - r - y0) / cell)), min(hh, int((y + r - y0) / cell) + 1)
        if c0 >= c1 or r0 >= r1:
            continue
        cx = x0 + (np.arange(c0, c1) + 0.5) * cell
        cy = y0 + (np.arange(r0, r1) + 0.5) * cell
        dx, dy = cx[None, :] - x, cy[:, None] - y
        c, s = math.cos(yaw), math.sin(yaw)
        inside = (np.abs(c * dx + s * dy) <= l / 2 + margin) & (np.abs(-s * dx + c * dy) <= w / 2 + margin)
        out[r0:r1, c0:c1] = np.maximum(out[r0:r1, c0:c1], inside.astype(np.float32))
    return out
