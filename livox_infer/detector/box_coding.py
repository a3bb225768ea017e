"""Box encoding of the detection head and its inverse (`decode_boxes`); the training targets use the same encoding.

Box encoding at a head cell (col, row) = floor of the box centre in head cells:
offset = centre - (col, row) in head cells, z = box centre height above ground (m),
size = log(l, w, h), yaw = (sin 2yaw, cos 2yaw). The doubled angle makes the target the same for a
box and its 180-degree turned twin: from one lidar frame the front and back of a car are often
indistinguishable, and regressing (sin, cos) of both would average to (0, 0), i.e. a random yaw.
Decoded yaw is therefore the box axis modulo pi, in [-pi/2, pi/2). `decode_boxes` inverts the
encoding (up to that), so boxes -> targets -> decode gives the boxes back (the round-trip test).
"""

from __future__ import annotations

import math

import torch

from livox_infer.detector.config import ModelConfig

LOG_SIZE_MIN, LOG_SIZE_MAX = math.log(0.05), math.log(30.0)


def decode_boxes(
    col: torch.Tensor, row: torch.Tensor, offset: torch.Tensor, z: torch.Tensor, log_size: torch.Tensor,
    yaw_sc: torch.Tensor, cfg: ModelConfig,
) -> torch.Tensor:
    """Head values at cells -> (..., 7) boxes in the voxelizer frame (z above ground).

    col/row (...), offset (..., 2), z (...), log_size (..., 3), yaw_sc (..., 2) as [sin 2yaw, cos 2yaw]."""
    cell = cfg.head_cell_size
    x = (col.to(offset.dtype) + offset[..., 0]) * cell + cfg.grid.x_range[0]
    y = (row.to(offset.dtype) + offset[..., 1]) * cell + cfg.grid.y_range[0]
    size = torch.exp(log_size.clamp(LOG_SIZE_MIN, LOG_SIZE_MAX))
    yaw = 0.5 * torch.atan2(yaw_sc[..., 0], yaw_sc[..., 1])
    return torch.stack([x, y, z, size[..., 0], size[..., 1], size[..., 2], yaw], dim=-1)
