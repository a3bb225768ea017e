"""Plain-torch voxelizer: the CPU path and the reference the Triton kernels are tested against.

Same integers as the kernels (integer fixed point; scatter/index_add on ints, so the point order
does not matter), then the same float ops in the same order for the normalisation, so its output
is bit-identical to the Triton path. Written without data-dependent shapes (invalid points go to
a spare "trash" cell at index n_cells) so it also runs under torch.compile(fullgraph=True).
"""

from __future__ import annotations

import torch

from livox_infer.voxelize.grid import INT32_MAX, INT32_MIN, INTENSITY_LEVELS, N_FIXED_CHANNELS, GridConfig


class ReferenceConstants:
    """The grid's constants as 0-dim float32 / int tensors on one device (built once per grid)."""

    def __init__(self, grid: GridConfig, device: torch.device | str = "cpu") -> None:
        k = grid.kernel_constants()
        t = lambda v: torch.tensor(v, dtype=torch.float32, device=device)  # noqa: E731
        self.grid = grid
        self.x_min, self.y_min, self.z_min = t(k["x_min"]), t(k["y_min"]), t(k["z_min"])
        self.inv_cell, self.inv_z_quantum = t(k["inv_cell"]), t(k["inv_z_quantum"])
        self.intensity_mult = t(k["intensity_mult"])
        self.inv_z_levels, self.inv_intensity_levels = t(k["inv_z_levels"]), t(k["inv_intensity_levels"])
        self.width, self.height, self.z_levels = k["width"], k["height"], k["z_levels"]
        self.levels_per_slice = k["levels_per_slice"]
        self.count_saturation = k["count_saturation"]
        self.count_lut = torch.from_numpy(grid.count_lut()).to(device)
        self.slice_bits = torch.arange(grid.n_height_slices, dtype=torch.int32, device=device)


def quantize_points(points: torch.Tensor, c: ReferenceConstants):
    """Per point: flat cell index (int64; n_cells when the point is out of range or NaN),
    z level, intensity level and height slice (int32). Mirrors kernel 1 op for op."""
    x, y, z, intensity = points.unbind(1)
    fx = (x - c.x_min) * c.inv_cell
    fy = (y - c.y_min) * c.inv_cell
    fz = (z - c.z_min) * c.inv_z_quantum
    # Comparisons are False for NaN, so NaN coordinates are out of range; +-inf fail them too.
    valid = (fx >= 0) & (fx < c.width) & (fy >= 0) & (fy < c.height) & (fz >= 0) & (fz < c.z_levels)
    valid &= intensity == intensity
    # Zero before the float->int casts so far-away points never wrap into the grid.
    zero = torch.zeros((), dtype=torch.float32, device=points.device)
    ix = torch.floor(torch.where(valid, fx, zero)).to(torch.int32)
    iy = torch.floor(torch.where(valid, fy, zero)).to(torch.int32)
    zq = torch.floor(torch.where(valid, fz, zero)).to(torch.int32)
    fi = torch.where(valid, intensity * c.intensity_mult, zero)
    fi = torch.where(fi > INTENSITY_LEVELS, torch.full_like(fi, INTENSITY_LEVELS), fi)
    fi = torch.where(fi < 0, zero, fi)
    iq = torch.floor(fi).to(torch.int32)
    n_cells = c.width * c.height
    cell = torch.where(valid, iy * c.width + ix, n_cells).to(torch.int64)
    return cell, zq, iq, zq // c.levels_per_slice


def accumulate_reference(points: torch.Tensor, grid: GridConfig, c: ReferenceConstants | None = None):
    """Kernel 1's accumulators, computed with plain torch. Returns a dict of (n_cells,) tensors:
    count, z_max, z_min, occupancy (int32; z_max/z_min INT32_MIN/INT32_MAX where empty,
    occupancy a bitmask of height slices) and z_sum, intensity_sum (int64)."""
    c = c or ReferenceConstants(grid, points.device)
    cell, zq, iq, zslice = quantize_points(points, c)
    n1 = grid.n_cells + 1  # + trash cell for invalid points
    dev = points.device
    count = torch.zeros(n1, dtype=torch.int32, device=dev).index_add_(0, cell, torch.ones_like(zq))
    z_max = torch.full((n1,), INT32_MIN, dtype=torch.int32, device=dev).scatter_reduce_(0, cell, zq, "amax")
    z_min = torch.full((n1,), INT32_MAX, dtype=torch.int32, device=dev).scatter_reduce_(0, cell, zq, "amin")
    z_sum = torch.zeros(n1, dtype=torch.int64, device=dev).index_add_(0, cell, zq.to(torch.int64))
    i_sum = torch.zeros(n1, dtype=torch.int64, device=dev).index_add_(0, cell, iq.to(torch.int64))
    # OR of one bit per slice == which (cell, slice) pairs occur; mark them, then pack the bits.
    s = grid.n_height_slices
    seen = torch.zeros(n1 * s, dtype=torch.int32, device=dev)
    seen.index_fill_(0, cell * s + zslice.to(torch.int64), 1)
    occupancy = (seen.view(n1, s) << c.slice_bits).sum(1, dtype=torch.int32)
    k = grid.n_cells
    return {
        "count": count[:k], "z_max": z_max[:k], "z_min": z_min[:k], "z_sum": z_sum[:k],
        "intensity_sum": i_sum[:k], "occupancy": occupancy[:k],
    }


def normalize_reference(acc: dict[str, torch.Tensor], grid: GridConfig, c: ReferenceConstants) -> torch.Tensor:
    """Kernel 2 in plain torch: accumulators -> (C, H, W) float32, same float ops in the same order."""
    count = acc["count"]
    occupied = count > 0
    zero = torch.zeros((), dtype=torch.float32, device=count.device)
    lut_index = torch.clamp(count, max=c.count_saturation).to(torch.int64)
    ch_count = c.count_lut[lut_index]
    ch_zmax = torch.where(occupied, acc["z_max"].to(torch.float32) * c.inv_z_levels, zero)
    ch_zmin = torch.where(occupied, acc["z_min"].to(torch.float32) * c.inv_z_levels, zero)
    # Rounded integer mean: floor((2*sum + n) / (2*n)); all terms >= 0, so floor == truncation.
    n = torch.where(occupied, count, 1).to(torch.int64)
    z_mean_q = torch.div(2 * acc["z_sum"] + n, 2 * n, rounding_mode="floor")
    i_mean_q = torch.div(2 * acc["intensity_sum"] + n, 2 * n, rounding_mode="floor")
    ch_zmean = torch.where(occupied, z_mean_q.to(torch.float32) * c.inv_z_levels, zero)
    ch_int = torch.where(occupied, i_mean_q.to(torch.float32) * c.inv_intensity_levels, zero)
    slices = ((acc["occupancy"].unsqueeze(0) >> c.slice_bits.unsqueeze(1)) & 1).to(torch.float32)
    out = torch.cat([torch.stack([ch_count, ch_zmax, ch_zmin, ch_zmean, ch_int]), slices])
    return out.view(grid.n_channels, grid.height, grid.width)


def voxelize_reference_dense(
    points: torch.Tensor, grid: GridConfig, constants: ReferenceConstants | None = None
) -> torch.Tensor:
    """Kernel 1 then kernel 2 mirrored over the dense grid; no data-dependent shapes, so it
    compiles with torch.compile(fullgraph=True). Same output as `voxelize_reference`."""
    c = constants or ReferenceConstants(grid, points.device)
    return normalize_reference(accumulate_reference(points, grid, c), grid, c)


REFERENCE_STATE_IDENTITIES = {
    "count": 0, "z_max": INT32_MIN, "z_min": INT32_MAX, "z_sum": 0, "intensity_sum": 0, "last_point": -1,
}


def new_reference_state(grid: GridConfig, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Per-cell accumulators of the fast CPU path (+ one trash cell for invalid points), reset.
    `voxelize_reference` leaves them reset again, so a caller can keep them across frames and
    skip allocating (and page-faulting in) megabytes per frame."""
    n1 = grid.n_cells + 1
    i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
    return {
        name: torch.full((n1,), identity, **(i64 if name in ("z_sum", "intensity_sum") else i32))
        for name, identity in REFERENCE_STATE_IDENTITIES.items()
    }


def voxelize_reference(
    points: torch.Tensor,
    grid: GridConfig,
    constants: ReferenceConstants | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """(N, 4) float32 [x, y, z, intensity] -> (C, H, W) float32 with plain torch ops: the CPU path.

    Same integers and float ops as the kernels, but it normalises only the occupied cells (the
    grid is mostly empty; touching every cell in eager torch costs milliseconds), sets the slice
    channels straight from each point's slice instead of packing a bitmask, and like kernel 2
    resets only the accumulator cells it used. `state` (from `new_reference_state`) is reused
    when given."""
    c = constants or ReferenceConstants(grid, points.device)
    s = state if state is not None else new_reference_state(grid, points.device)
    cell, zq, iq, zslice = quantize_points(points, c)
    n_cells, dev = grid.n_cells, points.device
    s["count"].scatter_add_(0, cell, torch.ones_like(zq))
    s["z_max"].scatter_reduce_(0, cell, zq, "amax")
    s["z_min"].scatter_reduce_(0, cell, zq, "amin")
    s["z_sum"].scatter_add_(0, cell, zq.to(torch.int64))
    s["intensity_sum"].scatter_add_(0, cell, iq.to(torch.int64))
    # One representative point per occupied cell (the last one): finds the occupied cells
    # without scanning the whole grid.
    point_index = torch.arange(points.shape[0], dtype=torch.int32, device=dev)
    s["last_point"].scatter_reduce_(0, cell, point_index, "amax")
    is_last = (s["last_point"].gather(0, cell) == point_index) & (cell < n_cells)
    cells = cell[torch.nonzero(is_last).squeeze(1)]

    n = s["count"].index_select(0, cells)
    ch_count = c.count_lut[torch.clamp(n, max=c.count_saturation).to(torch.int64)]
    ch_zmax = s["z_max"].index_select(0, cells).to(torch.float32) * c.inv_z_levels
    ch_zmin = s["z_min"].index_select(0, cells).to(torch.float32) * c.inv_z_levels
    n64 = n.to(torch.int64)
    z_mean_q = torch.div(2 * s["z_sum"].index_select(0, cells) + n64, 2 * n64, rounding_mode="floor")
    i_mean_q = torch.div(2 * s["intensity_sum"].index_select(0, cells) + n64, 2 * n64, rounding_mode="floor")
    ch_zmean = z_mean_q.to(torch.float32) * c.inv_z_levels
    ch_int = i_mean_q.to(torch.float32) * c.inv_intensity_levels

    # Flat output with one trailing trash element that invalid points write their slice to.
    n_out = grid.n_channels * n_cells
    out = torch.zeros(n_out + 1, dtype=torch.float32, device=dev)
    slice_index = torch.where(cell < n_cells, (N_FIXED_CHANNELS + zslice).to(torch.int64) * n_cells + cell, n_out)
    out.scatter_(0, slice_index, torch.ones_like(points[:, 0]))
    out2d = out[:n_out].view(grid.n_channels, n_cells)
    out2d[:N_FIXED_CHANNELS].index_copy_(1, cells, torch.stack([ch_count, ch_zmax, ch_zmin, ch_zmean, ch_int]))

    for name, identity in REFERENCE_STATE_IDENTITIES.items():
        s[name].index_fill_(0, cells, identity)
        s[name][n_cells:].fill_(identity)  # the trash cell
    return out2d.view(grid.shape)
