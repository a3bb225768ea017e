"""The `livox_infer::voxelize_fused` custom op: both Triton kernels behind `torch.library.triton_op` +
`wrap_triton`, so the op composes with torch.compile(fullgraph=True) (inductor sees the kernels and their
mutations). Imported (and so registered) by `Voxelizer` on first use of the "triton" backend only: importing the
kernels costs ~1.3 s, which a CPU-only node (the plain-torch reference) should not pay at start-up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
from torch.library import triton_op, wrap_triton

from livox_infer.voxelize.grid import MAX_POINTS
from livox_infer.voxelize.triton_kernels import (
    ACCUMULATE_BLOCK,
    ACCUMULATE_MAX_PROGRAMS,
    NORMALIZE_BLOCK,
    accumulate_kernel,
    normalize_kernel,
)


def launch_kernels(
    wrap: Callable,
    points: torch.Tensor,
    n_points: int,
    n_points_ptr: torch.Tensor | None,
    capacity: int,
    acc: dict[str, torch.Tensor] | list[torch.Tensor],
    count_lut: torch.Tensor,
    out: torch.Tensor,
    k: dict,
    n_slices: int,
    xy_offsets: bool = False,
) -> None:
    """Launch kernel 1 (if there can be points) and kernel 2. `wrap` is `wrap_triton` inside the
    custom op and the identity for direct launches (interpreter tests, CUDA-graph capture).
    With `n_points_ptr`, N is read on the device (grid sized for `capacity` points)."""
    count, z_max, z_min, occupancy, z_sum, i_sum, x_sum, y_sum = acc.values() if isinstance(acc, dict) else acc
    n_cells = k["width"] * k["height"]
    if capacity > 0:
        # sym_min: no guard on N under torch.compile's dynamic shapes
        programs = torch.sym_min(triton.cdiv(capacity, ACCUMULATE_BLOCK), ACCUMULATE_MAX_PROGRAMS)
        wrap(accumulate_kernel)[(programs,)](
            points, n_points, count_lut if n_points_ptr is None else n_points_ptr,
            count, z_max, z_min, occupancy, z_sum, i_sum, x_sum, y_sum,
            k["x_min"], k["y_min"], k["z_min"], k["inv_cell"], k["inv_z_quantum"], k["intensity_mult"],
            k["xy_levels"], k["width"], k["height"], k["z_levels"], k["levels_per_slice"],
            N_FROM_PTR=n_points_ptr is not None, XY_OFFSETS=xy_offsets, BLOCK=ACCUMULATE_BLOCK,
        )
    wrap(normalize_kernel)[(triton.cdiv(n_cells, NORMALIZE_BLOCK),)](
        count, z_max, z_min, occupancy, z_sum, i_sum, x_sum, y_sum, count_lut, out,
        n_cells, k["count_saturation"], k["inv_z_levels"], k["inv_intensity_levels"], k["inv_2_xy_levels"],
        N_SLICES=n_slices, XY_OFFSETS=xy_offsets, BLOCK=NORMALIZE_BLOCK,
    )


@triton_op(
    "livox_infer::voxelize_fused",
    mutates_args={"count", "z_max", "z_min", "occupancy", "z_sum", "intensity_sum", "x_sum", "y_sum"},
)
def voxelize_fused(
    points: torch.Tensor,
    count: torch.Tensor,
    z_max: torch.Tensor,
    z_min: torch.Tensor,
    occupancy: torch.Tensor,
    z_sum: torch.Tensor,
    intensity_sum: torch.Tensor,
    x_sum: torch.Tensor,
    y_sum: torch.Tensor,
    count_lut: torch.Tensor,
    x_min: float,
    y_min: float,
    z_min_m: float,
    inv_cell: float,
    inv_z_quantum: float,
    intensity_mult: float,
    width: int,
    height: int,
    z_levels: int,
    levels_per_slice: int,
    count_saturation: int,
    inv_z_levels: float,
    inv_intensity_levels: float,
    n_slices: int,
    xy_levels: float,
    inv_2_xy_levels: float,
    xy_offsets: bool,
) -> torch.Tensor:
    """Both Triton kernels: (N, 4) float32 points -> (5 [+ 2 with xy_offsets] + n_slices, height, width)
    float32. The accumulators must be in their reset state and are left in it."""
    n_channels = 5 + (2 if xy_offsets else 0) + n_slices
    out = torch.empty((n_channels, height, width), dtype=torch.float32, device=points.device)
    k = dict(
        x_min=x_min, y_min=y_min, z_min=z_min_m, inv_cell=inv_cell, inv_z_quantum=inv_z_quantum,
        intensity_mult=intensity_mult, width=width, height=height, z_levels=z_levels,
        levels_per_slice=levels_per_slice, count_saturation=count_saturation,
        inv_z_levels=inv_z_levels, inv_intensity_levels=inv_intensity_levels, xy_levels=xy_levels,
        inv_2_xy_levels=inv_2_xy_levels,
    )
    n = points.shape[0]
    # int32 flat offsets (4 * N) in kernel 1; Voxelizer raises PointCloudError before this.
    torch._check(n <= MAX_POINTS, lambda: f"voxelize_fused takes at most {MAX_POINTS} points, got {n}")
    acc = [count, z_max, z_min, occupancy, z_sum, intensity_sum, x_sum, y_sum]
    launch_kernels(wrap_triton, points, n, None, n, acc, count_lut, out, k, n_slices, xy_offsets)
    return out
