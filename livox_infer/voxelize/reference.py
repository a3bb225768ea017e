"""Plain-torch voxelizer: the CPU path and the reference the Triton kernels are tested against.

Same integers as the kernels (integer fixed point; scatter/index_add on ints, so the point order
does not matter), then the same float ops in the same order for the normalisation, so its output
is bit-identical to the Triton path. Written without data-dependent shapes (invalid points go to
a spare "trash" cell at index n_cells) so it also runs under torch.compile(fullgraph=True).
"""

from __future__ import annotations

import torch

from livox_infer.voxelize.grid import INT32_MAX, INT32_MIN, INTENSITY_LEVELS, GridConfig


# Points are quantised in chunks of this many rows, against pre-tiled constants (5 x 16 bytes per row).
TILED_ROWS_MAX = 1 << 16


class ReferenceConstants:
    """The grid's constants as float32 / int tensors on one device (built once per grid)."""

    def __init__(self, grid: GridConfig, device: torch.device | str = "cpu") -> None:
        k = grid.kernel_constants()
        t = lambda v: torch.tensor(v, dtype=torch.float32, device=device)  # noqa: E731
        self.grid = grid
        # Per-column constants for the (N, 4) [x, y, z, intensity] rows: origin, scale to cells /
        # z levels / intensity levels, clamp range, and the exclusive upper bounds of the valid range.
        self.origin = t([k["x_min"], k["y_min"], k["z_min"], 0.0])
        self.scale = t([k["inv_cell"], k["inv_cell"], k["inv_z_quantum"], k["intensity_mult"]])
        self.clamp_low = t([-1.0, -1.0, -1.0, 0.0])
        self.clamp_high = t([k["width"], k["height"], k["z_levels"], INTENSITY_LEVELS])
        self.upper = t([k["width"], k["height"], k["z_levels"], INTENSITY_LEVELS + 1])
        self._tiled: dict[str, torch.Tensor] = {}
        self._ones: dict[torch.dtype, torch.Tensor] = {}
        self.intensity_mult = t(k["intensity_mult"])
        self.inv_z_levels, self.inv_intensity_levels = t(k["inv_z_levels"]), t(k["inv_intensity_levels"])
        self.width, self.height, self.z_levels = k["width"], k["height"], k["z_levels"]
        self.levels_per_slice = k["levels_per_slice"]
        self.count_saturation = k["count_saturation"]
        self.xy_offsets = grid.xy_offsets
        self.xy_levels, self.inv_2_xy_levels = t(k["xy_levels"]), t(k["inv_2_xy_levels"])
        self.count_lut = torch.from_numpy(grid.count_lut()).to(device)
        self.slice_bits = torch.arange(grid.n_height_slices, dtype=torch.int32, device=device)
        # z level + 1 -> its slice channel; covers the levels -1 and z_levels that invalid points may carry
        # (their entries are never used).
        slice_of_level = torch.arange(-1, grid.z_levels + 1, dtype=torch.int64, device=device).clamp(0, grid.z_levels - 1)
        self.slice_channel = grid.slice_channel_start + slice_of_level // grid.levels_per_slice

    def tiled(self, n: int) -> dict[str, torch.Tensor]:
        """The per-column constants repeated for n <= TILED_ROWS_MAX rows, flat (4n,): same-shape
        flat operands keep torch's CPU kernels vectorised; broadcasting a (4,) row over (N, 4) does not."""
        if not self._tiled or self._tiled["origin"].numel() < 4 * n:
            rows = min(TILED_ROWS_MAX, max(n, 1024, 2 * (self._tiled["origin"].numel() // 4 if self._tiled else 0)))
            self._tiled = {name: getattr(self, name).repeat(rows)
                           for name in ("origin", "scale", "clamp_low", "clamp_high", "upper")}
        return {name: t[: 4 * n] for name, t in self._tiled.items()}

    def ones(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A (n,) tensor of ones (cached; do not write to it)."""
        cached = self._ones.get(dtype)
        if cached is None or cached.shape[0] < n:
            cached = self._ones[dtype] = torch.ones(max(n, 1024), dtype=dtype, device=self.count_lut.device)
        return cached[:n]


def quantize_points(points: torch.Tensor, c: ReferenceConstants):
    """Per point: flat cell index (int64; n_cells when the point is out of range or NaN),
    z level and intensity level (int64; for invalid points anything in [-1, limit]), the
    validity mask, and with the grid's sub-cell x/y channels the (2, N) int64 steps of the point
    inside its cell along x and y (else None).

    Same float32 sub / mul / compare / floor as kernel 1, done on whole (N, 4) rows (contiguous,
    so vectorised). The clamp to [-1, limit] changes no in-range value but keeps every float->int
    cast in range; for intensity it is the kernel's clamp to [0, 65535]. NaN survives the clamp and
    fails the range test, as in the kernel."""
    n = points.shape[0]
    if torch.compiler.is_compiling():  # inductor fuses the whole block: plain broadcasting is best
        k = {name: getattr(c, name) for name in ("origin", "scale", "clamp_low", "clamp_high", "upper")}
        rows = points
    elif n > TILED_ROWS_MAX:  # in chunks, so the tiles stay small and in cache
        parts = [quantize_points(points[i : i + TILED_ROWS_MAX], c) for i in range(0, n, TILED_ROWS_MAX)]
        return tuple(None if t[0] is None else torch.cat(t, dim=-1) for t in zip(*parts))
    else:
        k = c.tiled(n)
        rows = points.reshape(-1)
    scaled = (rows - k["origin"]).mul_(k["scale"]).clamp_(k["clamp_low"], k["clamp_high"])
    in_range = (scaled >= 0) & (scaled < k["upper"])  # (4N,) flat or (N, 4) bool
    if rows is points:
        valid = in_range.all(1)
    else:  # four bools of a row read as one int32: cheaper than a reduction over rows of 4
        valid = (in_range.view(torch.int32) == 0x01010101).view(n)
    # Invalid rows keep their clamped levels in [-1, limit]: they only ever reach the trash cell.
    scaled = scaled.nan_to_num_(0.0)
    floored = scaled.floor() if c.xy_offsets else scaled.floor_()  # in place when the fraction is not needed
    xy_step = None
    if c.xy_offsets:
        # As kernel 1: (u - floor(u)) * 256, floor; exact in float32 (for valid points u >= 0, so the
        # int cast's truncation is the floor). All four columns at once: flat, vectorised, cheaper
        # than picking two strided ones. Rows x, y of a (2, N) contiguous tensor.
        steps = (scaled - floored).mul_(c.xy_levels).to(torch.int32).view(n, 4)
        xy_step = steps[:, :2].t().to(torch.int64)
    q = floored.to(torch.int64).view(n, 4)
    cell = torch.where(valid, q[:, 1] * c.width + q[:, 0], c.width * c.height)
    return cell, q[:, 2], q[:, 3], valid, xy_step


def accumulate_reference(points: torch.Tensor, grid: GridConfig, c: ReferenceConstants | None = None):
    """Kernel 1's accumulators, computed with plain torch. Returns a dict of (n_cells,) tensors:
    count, z_max, z_min, occupancy (int32; z_max/z_min INT32_MIN/INT32_MAX where empty,
    occupancy a bitmask of height slices) and z_sum, intensity_sum (int64)."""
    c = c or ReferenceConstants(grid, points.device)
    cell, zq64, iq, _, xy_step = quantize_points(points, c)
    zq = zq64.to(torch.int32)
    # (clamped: invalid points may carry levels -1 / z_levels; they land in the trash cell)
    zslice = (zq64 // c.levels_per_slice).clamp_(0, grid.n_height_slices - 1)
    n1 = grid.n_cells + 1  # + trash cell for invalid points
    dev = points.device
    count = torch.zeros(n1, dtype=torch.int32, device=dev).index_add_(0, cell, torch.ones_like(zq))
    z_max = torch.full((n1,), INT32_MIN, dtype=torch.int32, device=dev).scatter_reduce_(0, cell, zq, "amax")
    z_min = torch.full((n1,), INT32_MAX, dtype=torch.int32, device=dev).scatter_reduce_(0, cell, zq, "amin")
    z_sum = torch.zeros(n1, dtype=torch.int64, device=dev).index_add_(0, cell, zq64)
    i_sum = torch.zeros(n1, dtype=torch.int64, device=dev).index_add_(0, cell, iq)
    # OR of one bit per slice == which (cell, slice) pairs occur; mark them, then pack the bits.
    s = grid.n_height_slices
    seen = torch.zeros(n1 * s, dtype=torch.int32, device=dev)
    seen.index_fill_(0, cell * s + zslice, 1)
    occupancy = (seen.view(n1, s) << c.slice_bits).sum(1, dtype=torch.int32)
    k = grid.n_cells
    acc = {
        "count": count[:k], "z_max": z_max[:k], "z_min": z_min[:k], "z_sum": z_sum[:k],
        "intensity_sum": i_sum[:k], "occupancy": occupancy[:k],
    }
    if xy_step is not None:
        for j, name in enumerate(XY_SUMS):
            acc[name] = torch.zeros(n1, dtype=torch.int64, device=dev).index_add_(0, cell, xy_step[j])[:k]
    return acc


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
    fixed = [ch_count, ch_zmax, ch_zmin, ch_zmean, ch_int]
    if grid.xy_offsets:  # (2 * rounded mean step + 1) / (2 * levels), as kernel 2
        for name in XY_SUMS:
            odd = 2 * torch.div(2 * acc[name] + n, 2 * n, rounding_mode="floor") + 1
            fixed.append(torch.where(occupied, odd.to(torch.float32) * c.inv_2_xy_levels, zero))
    slices = ((acc["occupancy"].unsqueeze(0) >> c.slice_bits.unsqueeze(1)) & 1).to(torch.float32)
    out = torch.cat([torch.stack(fixed), slices])
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
XY_SUMS = ("x_sum", "y_sum")  # state of grids with the sub-cell x/y channels
STATE_IDENTITIES = {**REFERENCE_STATE_IDENTITIES, **dict.fromkeys(XY_SUMS, 0)}


def new_reference_state(grid: GridConfig, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Per-cell int64 accumulators of the fast CPU path (+ one trash cell for invalid points),
    reset. `voxelize_reference` leaves them reset again, so a caller can keep them across frames
    and skip allocating (and page-faulting in) them per frame. (int64 throughout: the index and
    value dtype of torch's scatter ops, so no conversions per frame; the values equal the
    kernel's int32 ones.)"""
    names = [n for n in STATE_IDENTITIES if grid.xy_offsets or n not in XY_SUMS]
    return {
        name: torch.full((grid.n_cells + 1,), STATE_IDENTITIES[name], dtype=torch.int64, device=device)
        for name in names
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
    when given. The (C, H, W) result has channels-last strides (a permuted (H, W, C) tensor): what the network
    takes; ``.contiguous()`` gives the plain layout."""
    c = constants or ReferenceConstants(grid, points.device)
    s = state if state is not None else new_reference_state(grid, points.device)
    n_points, n_cells, dev = points.shape[0], grid.n_cells, points.device
    cell, zq, iq, valid, xy_step = quantize_points(points, c)
    s["count"].scatter_add_(0, cell, c.ones(n_points, torch.int64))
    s["z_max"].scatter_reduce_(0, cell, zq, "amax")
    s["z_min"].scatter_reduce_(0, cell, zq, "amin")
    s["z_sum"].scatter_add_(0, cell, zq)
    s["intensity_sum"].scatter_add_(0, cell, iq)
    if xy_step is not None:
        for j, name in enumerate(XY_SUMS):
            s[name].scatter_add_(0, cell, xy_step[j])
    if n_cells <= 2 * n_points:  # small grid: scanning it is cheaper than the trick below
        cells = torch.nonzero(s["count"][:n_cells]).squeeze(1)
    else:  # one representative point per occupied cell (the last one), no scan of the grid
        point_index = torch.arange(n_points, dtype=torch.int64, device=dev)
        s["last_point"].scatter_reduce_(0, cell, point_index, "amax")
        is_last = (s["last_point"].gather(0, cell) == point_index) & valid
        cells = cell[torch.nonzero(is_last).squeeze(1)]
        s["last_point"].index_fill_(0, cells, -1)
        s["last_point"][n_cells:].fill_(-1)

    n = s["count"].index_select(0, cells)
    two_n = 2 * n

    def rounded_mean(sums: torch.Tensor) -> torch.Tensor:  # floor((2*sum + n) / (2*n)), as kernel 2
        return sums.index_select(0, cells).mul_(2).add_(n).div_(two_n, rounding_mode="floor")

    channels = [
        c.count_lut.index_select(0, n.clamp(max=c.count_saturation)),
        s["z_max"].index_select(0, cells).to(torch.float32).mul_(c.inv_z_levels),
        s["z_min"].index_select(0, cells).to(torch.float32).mul_(c.inv_z_levels),
        rounded_mean(s["z_sum"]).to(torch.float32).mul_(c.inv_z_levels),
        rounded_mean(s["intensity_sum"]).to(torch.float32).mul_(c.inv_intensity_levels),
    ]
    if xy_step is not None:  # (2 * rounded mean step + 1) / (2 * levels), as kernel 2
        for name in XY_SUMS:
            channels.append(rounded_mean(s[name]).mul_(2).add_(1).to(torch.float32).mul_(c.inv_2_xy_levels))

    # Flat output, cell-major (H, W, C: the network's channels_last input, so the pipeline's copy into it is a plain
    # copy, not a transpose), with one trailing trash element that invalid points write their slice to.
    n_ch = grid.n_channels
    n_out = n_ch * n_cells
    out = torch.zeros(n_out + 1, dtype=torch.float32, device=dev)
    slice_index = torch.where(valid, cell * n_ch + c.slice_channel.index_select(0, zq + 1), n_out)
    out.scatter_(0, slice_index, c.ones(n_points, torch.float32))
    out2d = out[:n_out].view(n_cells, n_ch)
    out2d[:, : len(channels)].index_copy_(0, cells, torch.stack(channels, dim=1))

    dense_reset = 4 * cells.shape[0] >= n_cells  # many cells touched: a memset beats scattered writes
    for name in s.keys() - {"last_point"}:  # (reset above, only for the cells it marked)
        identity = STATE_IDENTITIES[name]
        if dense_reset:
            s[name].fill_(identity)
        else:
            s[name].index_fill_(0, cells, identity)
            s[name][n_cells:].fill_(identity)  # the trash cell
    return out2d.view(grid.height, grid.width, n_ch).permute(2, 0, 1)  # (C, H, W), channels-last strides
