"""The two Triton kernels of the voxelizer (plain-torch twin: livox_infer/voxelize/reference.py).

Kernel 1 `accumulate_kernel` (one launch): per point range test, fixed-point quantisation and six
(eight with the sub-cell x/y channels) integer atomics into per-cell accumulators. Integer atomics commute, so the accumulators (and hence
the output) do not depend on point order or thread scheduling; float atomics would.

Kernel 2 `normalize_kernel`: per cell, accumulators -> C float channels, and it resets the
accumulators to their identity values as it reads them, so the next frame needs no memset launch.
Empty cells (count 0) are still at their identities, so only their count is read and only their
zero channels are written: most of the per-frame traffic is the dense output itself.

Float ops are kept to single IEEE-exact steps (sub, mul, compare, floor, int->float) and never of
the a*b+c shape, so no FMA contraction can change a result between GPU, interpreter and CPU; log is
a gathered table, means are integer divisions. The rules are the same on every vendor's backend.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from livox_infer.voxelize.grid import (
    INT32_MAX,
    INT32_MIN,
    INTENSITY_LEVELS,
    N_FIXED_CHANNELS,
    XY_OFFSET_LEVELS,
    GridConfig,
)

# The interpreter (TRITON_INTERPRET=1, CPU tests) pays per program, not per lane: use big blocks there.
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
ACCUMULATE_BLOCK = 8192 if INTERPRETING else 256
NORMALIZE_BLOCK = 8192 if INTERPRETING else 512
# Cap on kernel 1's programs (it loops over the rest): ~8 per SM on a 132-SM H200.
ACCUMULATE_MAX_PROGRAMS = 1024


@triton.jit
def accumulate_kernel(
    points_ptr,  # (N, 4) float32, contiguous
    n_points,  # N (used when not N_FROM_PTR)
    n_points_ptr,  # int32[1] holding N (used when N_FROM_PTR: CUDA-graph replay with a varying N)
    count_ptr, z_max_ptr, z_min_ptr, occupancy_ptr,  # int32[n_cells]
    z_sum_ptr, intensity_sum_ptr,  # int64[n_cells]
    x_sum_ptr, y_sum_ptr,  # int64[n_cells] (XY_OFFSETS) or unused
    x_min, y_min, z_min, inv_cell, inv_z_quantum, intensity_mult, xy_levels,  # fp32
    width, height, z_levels, levels_per_slice,  # int32
    N_FROM_PTR: tl.constexpr,
    XY_OFFSETS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if N_FROM_PTR:
        n = tl.load(n_points_ptr)
    else:
        n = n_points
    # Grid-stride loop: the launch is capped at a fixed number of programs, so a CUDA graph
    # captured for a large capacity costs no more per frame than one sized for the actual N.
    for block_start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = block_start + tl.arange(0, BLOCK)
        loaded = offs < n
        base = offs * 4  # N <= 2**28 keeps this inside int32
        nan = float("nan")  # masked-off lanes read NaN, which fails every range test below
        x = tl.load(points_ptr + base, mask=loaded, other=nan)
        y = tl.load(points_ptr + base + 1, mask=loaded, other=nan)
        z = tl.load(points_ptr + base + 2, mask=loaded, other=nan)
        intensity = tl.load(points_ptr + base + 3, mask=loaded, other=nan)

        fx = (x - x_min) * inv_cell
        fy = (y - y_min) * inv_cell
        fz = (z - z_min) * inv_z_quantum
        valid = (fx >= 0.0) & (fx < width) & (fy >= 0.0) & (fy < height) & (fz >= 0.0) & (fz < z_levels)
        valid = valid & (intensity == intensity) & loaded
        # Zero before the float->int casts: an out-of-range value must never wrap into the grid.
        ix = tl.floor(tl.where(valid, fx, 0.0)).to(tl.int32)
        iy = tl.floor(tl.where(valid, fy, 0.0)).to(tl.int32)
        zq = tl.floor(tl.where(valid, fz, 0.0)).to(tl.int32)
        fi = tl.where(valid, intensity * intensity_mult, 0.0)
        fi = tl.where(fi > 65535.0, 65535.0, fi)  # INTENSITY_LEVELS
        fi = tl.where(fi < 0.0, 0.0, fi)
        iq = tl.floor(fi).to(tl.int32)
        cell = iy * width + ix
        slice_bit = tl.full((BLOCK,), 1, tl.int32) << (zq // levels_per_slice)

        tl.atomic_add(count_ptr + cell, tl.full((BLOCK,), 1, tl.int32), mask=valid, sem="relaxed")
        tl.atomic_max(z_max_ptr + cell, zq, mask=valid, sem="relaxed")
        tl.atomic_min(z_min_ptr + cell, zq, mask=valid, sem="relaxed")
        tl.atomic_or(occupancy_ptr + cell, slice_bit, mask=valid, sem="relaxed")
        tl.atomic_add(z_sum_ptr + cell, zq.to(tl.int64), mask=valid, sem="relaxed")
        tl.atomic_add(intensity_sum_ptr + cell, iq.to(tl.int64), mask=valid, sem="relaxed")
        if XY_OFFSETS:
            # Position inside the cell: u - floor(u) is exact in float32, * 256 is exact, floor is exact.
            ux = tl.where(valid, fx, 0.0)
            uy = tl.where(valid, fy, 0.0)
            xq = tl.floor((ux - tl.floor(ux)) * xy_levels).to(tl.int64)
            yq = tl.floor((uy - tl.floor(uy)) * xy_levels).to(tl.int64)
            tl.atomic_add(x_sum_ptr + cell, xq, mask=valid, sem="relaxed")
            tl.atomic_add(y_sum_ptr + cell, yq, mask=valid, sem="relaxed")


@triton.jit
def normalize_kernel(
    count_ptr, z_max_ptr, z_min_ptr, occupancy_ptr,  # int32[n_cells]
    z_sum_ptr, intensity_sum_ptr,  # int64[n_cells]
    x_sum_ptr, y_sum_ptr,  # int64[n_cells] (XY_OFFSETS) or unused
    count_lut_ptr,  # float32[count_saturation + 1]
    out_ptr,  # float32 (C, n_cells)
    n_cells, count_saturation,  # int32
    inv_z_levels, inv_intensity_levels, inv_2_xy_levels,  # fp32
    N_SLICES: tl.constexpr,
    XY_OFFSETS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_cells
    count = tl.load(count_ptr + offs, mask=m, other=0)
    # Kernel 1 touches all six accumulators of a cell or none, so an empty cell's are still at
    # their identities: read and reset only occupied cells (most of the grid is empty).
    occupied = count > 0
    used = m & occupied
    z_max = tl.load(z_max_ptr + offs, mask=used, other=0)
    z_min = tl.load(z_min_ptr + offs, mask=used, other=0)
    occupancy = tl.load(occupancy_ptr + offs, mask=used, other=0)
    z_sum = tl.load(z_sum_ptr + offs, mask=used, other=0)
    i_sum = tl.load(intensity_sum_ptr + offs, mask=used, other=0)
    # Reset to the identities of add / max / min / or for the next frame.
    zeros32 = tl.zeros((BLOCK,), tl.int32)
    zeros64 = tl.zeros((BLOCK,), tl.int64)
    tl.store(count_ptr + offs, zeros32, mask=used)
    tl.store(z_max_ptr + offs, tl.full((BLOCK,), -2147483648, tl.int32), mask=used)  # INT32_MIN
    tl.store(z_min_ptr + offs, tl.full((BLOCK,), 2147483647, tl.int32), mask=used)  # INT32_MAX
    tl.store(occupancy_ptr + offs, zeros32, mask=used)
    tl.store(z_sum_ptr + offs, zeros64, mask=used)
    tl.store(intensity_sum_ptr + offs, zeros64, mask=used)

    # (an empty cell's count channel is lut[0] == 0.0: no need to read it)
    ch_count = tl.load(count_lut_ptr + tl.minimum(count, count_saturation), mask=used, other=0.0)
    ch_zmax = tl.where(occupied, z_max.to(tl.float32) * inv_z_levels, 0.0)
    ch_zmin = tl.where(occupied, z_min.to(tl.float32) * inv_z_levels, 0.0)
    # Rounded integer mean floor((2*sum + n) / (2*n)); all terms >= 0 so truncation == floor.
    n = tl.where(occupied, count, 1).to(tl.int64)
    z_mean_q = (2 * z_sum + n) // (2 * n)
    i_mean_q = (2 * i_sum + n) // (2 * n)
    ch_zmean = tl.where(occupied, z_mean_q.to(tl.float32) * inv_z_levels, 0.0)
    ch_int = tl.where(occupied, i_mean_q.to(tl.float32) * inv_intensity_levels, 0.0)
    tl.store(out_ptr + offs, ch_count, mask=m)
    tl.store(out_ptr + n_cells + offs, ch_zmax, mask=m)
    tl.store(out_ptr + 2 * n_cells + offs, ch_zmin, mask=m)
    tl.store(out_ptr + 3 * n_cells + offs, ch_zmean, mask=m)
    tl.store(out_ptr + 4 * n_cells + offs, ch_int, mask=m)
    if XY_OFFSETS:
        x_sum = tl.load(x_sum_ptr + offs, mask=used, other=0)
        y_sum = tl.load(y_sum_ptr + offs, mask=used, other=0)
        tl.store(x_sum_ptr + offs, zeros64, mask=used)
        tl.store(y_sum_ptr + offs, zeros64, mask=used)
        # (2 * mean + 1) / (2 * levels): the centre of the mean's step, so a mirrored cell reads 1 - value
        x_odd = 2 * ((2 * x_sum + n) // (2 * n)) + 1
        y_odd = 2 * ((2 * y_sum + n) // (2 * n)) + 1
        tl.store(out_ptr + 5 * n_cells + offs, tl.where(occupied, x_odd.to(tl.float32) * inv_2_xy_levels, 0.0), mask=m)
        tl.store(out_ptr + 6 * n_cells + offs, tl.where(occupied, y_odd.to(tl.float32) * inv_2_xy_levels, 0.0), mask=m)
        first_slice = 7
    else:
        first_slice = 5
    for k in tl.static_range(N_SLICES):
        tl.store(out_ptr + (first_slice + k) * n_cells + offs, ((occupancy >> k) & 1).to(tl.float32), mask=m)


ACCUMULATOR_NAMES = ("count", "z_max", "z_min", "occupancy", "z_sum", "intensity_sum", "x_sum", "y_sum")


def new_accumulators(grid: GridConfig, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Accumulators in their reset state (what kernel 2 leaves behind). x_sum / y_sum are one
    unused element when the grid has no sub-cell x/y channels (the op's signature is fixed)."""
    n = grid.n_cells
    i32 = dict(dtype=torch.int32, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    n_xy = n if grid.xy_offsets else 1
    return {
        "count": torch.zeros(n, **i32),
        "z_max": torch.full((n,), INT32_MIN, **i32),
        "z_min": torch.full((n,), INT32_MAX, **i32),
        "occupancy": torch.zeros(n, **i32),
        "z_sum": torch.zeros(n, **i64),
        "intensity_sum": torch.zeros(n, **i64),
        "x_sum": torch.zeros(n_xy, **i64),
        "y_sum": torch.zeros(n_xy, **i64),
    }


# literals inside the kernels
assert INTENSITY_LEVELS == 65535 and N_FIXED_CHANNELS == 5 and XY_OFFSET_LEVELS == 256
