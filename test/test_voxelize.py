"""Voxelizer: Triton kernels (in the interpreter, TRITON_INTERPRET=1 from conftest) == plain-torch
CPU path, bit for bit; reset of the accumulators; channel semantics; config and input errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from livox_infer.errors import BackendError, ConfigError, PointCloudError
from livox_infer.voxelize import GridConfig, Voxelizer, voxelize, voxelize_reference
from livox_infer.voxelize.grid import INTENSITY_LEVELS
from livox_infer.voxelize.reference import (
    ReferenceConstants,
    accumulate_reference,
    new_reference_state,
    normalize_reference,
    voxelize_reference_dense,
)
from livox_infer.voxelize.triton_kernels import accumulate_kernel, new_accumulators, normalize_kernel
from livox_infer.voxelize.fused_op import launch_kernels

torch.set_num_threads(1)
# The interpreter computes 3e38 * (1/cell) in numpy, which warns on the (intended) overflow to inf.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

# 32 x 24 cells of 0.25 m, z in [-0.5, 3.5) with 8 slices of 0.5 m (100 z levels of 5 mm each).
GRID = GridConfig(x_range=(0.0, 8.0), y_range=(-3.0, 3.0), z_range=(-0.5, 3.5), cell_size=0.25, n_height_slices=8)
# The same grid with the two sub-cell x/y channels (15 channels, slices start at 7).
GRID_XY = dataclasses.replace(GRID, xy_offsets=True)
GRIDS = pytest.mark.parametrize("grid", [GRID, GRID_XY], ids=["plain", "xy"])


def random_cloud(n: int, seed: int, grid: GridConfig = GRID, margin: float = 1.0) -> torch.Tensor:
    """Uniform points over the grid plus a margin outside it; intensity partly outside [0, 255]."""
    g = torch.Generator().manual_seed(seed)
    lo = torch.tensor([grid.x_range[0] - margin, grid.y_range[0] - margin, grid.z_range[0] - margin, -20.0])
    hi = torch.tensor([grid.x_range[1] + margin, grid.y_range[1] + margin, grid.z_range[1] + margin, 300.0])
    return lo + torch.rand(n, 4, generator=g) * (hi - lo)


def clustered_cloud(seed: int, grid: GridConfig = GRID) -> torch.Tensor:
    """A few cells holding hundreds of points each (heavy atomic contention on one address)."""
    g = torch.Generator().manual_seed(seed)
    centres = random_cloud(12, seed + 1, grid, margin=0.0)
    pts = centres.repeat_interleave(300, 0)
    pts[:, :3] += (torch.rand(pts.shape[0], 3, generator=g) - 0.5) * torch.tensor([0.1, 0.1, 2.0])
    pts[:, 3] = torch.rand(pts.shape[0], generator=g) * 255.0
    return pts


def edge_cloud(grid: GridConfig = GRID) -> torch.Tensor:
    """Points exactly on and just inside/outside every boundary of the grid."""
    (x0, x1), (y0, y1), (z0, z1) = grid.x_range, grid.y_range, grid.z_range
    below = lambda v: float(np.nextafter(np.float32(v), np.float32(-np.inf)))  # noqa: E731
    above = lambda v: float(np.nextafter(np.float32(v), np.float32(np.inf)))  # noqa: E731
    xs = [x0, above(x0), below(x0), x1, below(x1), above(x1), x0 + grid.cell_size, below(x0 + grid.cell_size)]
    ys = [y0, above(y0), below(y0), y1, below(y1), above(y1), 0.0, below(0.0)]
    zs = [z0, above(z0), below(z0), z1, below(z1), 0.0, z0 + 0.5, below(z0 + 0.5)]
    pts = [[x, y, z, i] for x in xs for y in ys for z in zs for i in (0.0, 255.0, 256.0, -1.0)]
    return torch.tensor(pts, dtype=torch.float32)


def extreme_cloud() -> torch.Tensor:
    """Huge, infinite and NaN coordinates mixed with ordinary points."""
    special = [1e30, -1e30, math.inf, -math.inf, math.nan, 3e38, -3e38, 1e-40, -1e-40]
    base = random_cloud(64, 7, margin=0.0)
    rows = []
    for k, v in enumerate(special):
        for col in range(4):
            p = base[(k * 4 + col) % 64].clone()
            p[col] = v
            rows.append(p)
    return torch.cat([torch.stack(rows), base])


def triton_voxelize(points: torch.Tensor, grid: GridConfig = GRID, voxelizer: Voxelizer | None = None) -> torch.Tensor:
    v = voxelizer or Voxelizer(grid, "cpu", backend="triton")
    return v(points)


def assert_reset(v: Voxelizer) -> None:
    fresh = new_accumulators(v.grid, "cpu")
    for name, acc in v.accumulators().items():
        assert torch.equal(acc, fresh[name]), f"accumulator {name} not back in its reset state"


CLOUDS = {
    "random": lambda: random_cloud(3000, 0),
    "clustered": lambda: clustered_cloud(1),
    "empty": lambda: torch.zeros((0, 4)),
    "all_out_of_range": lambda: random_cloud(500, 2) + torch.tensor([100.0, 0.0, 0.0, 0.0]),
    "edges": edge_cloud,
    "extreme": extreme_cloud,
    "single": lambda: torch.tensor([[1.01, 0.05, 1.25, 128.0]]),
}


@GRIDS
@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_triton_equals_torch_bit_for_bit(name, grid):
    points = CLOUDS[name]()
    ref = voxelize_reference(points, grid)
    v = Voxelizer(grid, "cpu", backend="triton")
    out = triton_voxelize(points, voxelizer=v)
    assert out.shape == grid.shape == ref.shape
    assert out.dtype == ref.dtype == torch.float32
    assert torch.equal(out, ref)
    assert torch.equal(voxelize_reference_dense(points, grid), ref)
    assert_reset(v)


def test_result_is_independent_of_point_order():
    points = torch.cat([clustered_cloud(3), random_cloud(2000, 4)])
    shuffled = points[torch.randperm(points.shape[0], generator=torch.Generator().manual_seed(5))]
    ref = voxelize_reference(points, GRID)
    assert torch.equal(voxelize_reference(shuffled, GRID), ref)
    v = Voxelizer(GRID, "cpu", backend="triton")
    assert torch.equal(v(points), ref)
    assert torch.equal(v(shuffled), ref)


@GRIDS
def test_consecutive_frames_through_one_voxelizer_match_fresh_references(grid):
    """Kernel 2 must leave the accumulators reset, else frame 2 would carry frame 1's points."""
    frames = [clustered_cloud(6), random_cloud(1500, 7), torch.zeros((0, 4)), random_cloud(10, 8)]
    v_triton = Voxelizer(grid, "cpu", backend="triton")
    v_torch = Voxelizer(grid, "cpu", backend="torch")
    for points in frames:
        ref = voxelize_reference(points, grid)
        assert torch.equal(v_triton(points), ref)
        assert_reset(v_triton)
        assert torch.equal(v_torch(points), ref)
        assert torch.equal(v_torch(points), ref)


def test_reused_reference_state_is_reset_after_each_frame():
    state = new_reference_state(GRID)
    c = ReferenceConstants(GRID)
    for seed in range(3):
        points = torch.cat([random_cloud(800, seed), clustered_cloud(seed), extreme_cloud()])
        assert torch.equal(voxelize_reference(points, GRID, c, state), voxelize_reference(points, GRID))
        fresh = new_reference_state(GRID)
        assert all(torch.equal(state[k], fresh[k]) for k in fresh)


@GRIDS
def test_kernel1_accumulators_equal_torch_accumulators(grid):
    """Kernel 1 alone (no normalisation) against its plain-torch twin, incl. the device-side N
    path used by CUDA-graph replay (points past N in the buffer must be ignored) and the
    grid-stride loop (fewer programs than blocks)."""
    points = torch.cat([clustered_cloud(9), random_cloud(2000, 10), edge_cloud()])
    n = points.shape[0]
    buffer = torch.cat([points, random_cloud(777, 11, margin=0.0)])  # stale points past N
    expected = accumulate_reference(points, grid)
    assert ("x_sum" in expected) == grid.xy_offsets
    k = grid.kernel_constants()
    # (from_ptr, block, programs): 2 programs of 1024 lanes loop over the ~5k points (grid stride)
    for from_ptr, block, programs in ((False, 8192, 1), (True, 8192, 1), (False, 1024, 2), (True, 1024, 3)):
        acc = new_accumulators(grid, "cpu")
        accumulate_kernel[(programs,)](
            buffer, n, torch.tensor([n], dtype=torch.int32), *acc.values(),
            k["x_min"], k["y_min"], k["z_min"], k["inv_cell"], k["inv_z_quantum"], k["intensity_mult"],
            k["xy_levels"], k["width"], k["height"], k["z_levels"], k["levels_per_slice"],
            N_FROM_PTR=from_ptr, XY_OFFSETS=grid.xy_offsets, BLOCK=block,
        )
        for name, value in expected.items():
            assert torch.equal(acc[name], value), name


@GRIDS
def test_kernel2_alone_equals_torch_normalisation(grid):
    """Kernel 2 fed with the torch accumulators == normalize_reference, and it resets them."""
    points = torch.cat([clustered_cloud(15), random_cloud(2000, 16), edge_cloud()])
    c = ReferenceConstants(grid)
    acc = accumulate_reference(points, grid, c)
    expected = normalize_reference(acc, grid, c)
    fresh = new_accumulators(grid, "cpu")
    acc = {name: acc[name].clone() if name in acc else fresh[name].clone() for name in fresh}  # the kernel's order
    out = torch.empty(grid.shape)
    k = grid.kernel_constants()
    normalize_kernel[(2,)](
        *acc.values(), torch.from_numpy(grid.count_lut()), out,
        grid.n_cells, k["count_saturation"], k["inv_z_levels"], k["inv_intensity_levels"], k["inv_2_xy_levels"],
        N_SLICES=grid.n_height_slices, XY_OFFSETS=grid.xy_offsets, BLOCK=512,
    )
    assert torch.equal(out, expected)
    assert all(torch.equal(acc[name], fresh[name]) for name in fresh)


@GRIDS
def test_device_side_point_count_launch_matches_reference(grid):
    """launch_kernels with N read from a tensor (the CUDA-graph path) on a padded buffer."""
    points = random_cloud(1200, 12)
    buffer = torch.cat([points, random_cloud(500, 13, margin=0.0)])
    v = Voxelizer(grid, "cpu", backend="triton")
    out = torch.empty(grid.shape)
    n_ptr = torch.tensor([points.shape[0]], dtype=torch.int32)
    launch_kernels(lambda f: f, buffer, 0, n_ptr, buffer.shape[0], v.accumulators(), v.count_lut, out,
                   v.constants, grid.n_height_slices, grid.xy_offsets)
    assert torch.equal(out, voxelize_reference(points, grid))
    assert_reset(v)


def test_kernel2_reference_normalises_kernel1_reference():
    points = clustered_cloud(14)
    c = ReferenceConstants(GRID)
    assert torch.equal(normalize_reference(accumulate_reference(points, GRID, c), GRID, c),
                       voxelize_reference(points, GRID, c))


# -- semantics -----------------------------------------------------------------------------------

def test_single_point_channels():
    x, y, z, intensity = 1.01, 0.05, 1.25, 128.0
    out = voxelize(torch.tensor([[x, y, z, intensity]]), GRID, backend="cpu")
    ix, iy = int((x - 0.0) / 0.25), int((y + 3.0) / 0.25)
    cell = out[:, iy, ix]
    level = (z + 0.5) / 0.005  # 350 of 800
    assert cell[0].item() == pytest.approx(math.log1p(1) / math.log1p(255), abs=1e-7)
    assert cell[1].item() == pytest.approx(level / 800, abs=1e-7)  # z_max
    assert cell[2].item() == pytest.approx(level / 800, abs=1e-7)  # z_min
    assert cell[3].item() == pytest.approx(level / 800, abs=1e-7)  # z_mean
    assert cell[4].item() == pytest.approx(intensity / 255.0, abs=1.0 / INTENSITY_LEVELS)
    slices = cell[5:].tolist()
    assert slices == [1.0 if k == int(level // 100) else 0.0 for k in range(8)]  # slice 3: [1.0, 1.5) m
    out[:, iy, ix] = 0
    assert not out.any(), "a single point must touch a single cell"


def test_cell_statistics_of_several_points():
    pts = torch.tensor([
        [2.1, 1.1, 0.0, 10.0],
        [2.2, 1.2, 2.0, 20.0],
        [2.15, 1.05, 1.0, 300.0],  # intensity clamps to 1
        [2.2, 1.1, 9.0, 50.0],  # above z range: ignored
    ])
    out = voxelize_reference(pts, GRID)
    ix, iy = 8, 16
    c = out[:, iy, ix]
    assert c[0].item() == pytest.approx(math.log1p(3) / math.log1p(255), abs=1e-7)
    assert c[1].item() == pytest.approx(2.5 / 4.0, abs=1e-6)
    assert c[2].item() == pytest.approx(0.5 / 4.0, abs=1e-6)
    assert c[3].item() == pytest.approx(1.5 / 4.0, abs=2e-3)
    assert c[4].item() == pytest.approx((10 / 255 + 20 / 255 + 1.0) / 3, abs=1e-4)
    assert c[5:].tolist() == [0, 1, 0, 1, 0, 1, 0, 0]
    assert torch.count_nonzero(out.sum(0)) == 1


def test_sub_cell_xy_channels():
    """x_offset_mean / y_offset_mean: the mean position of the cell's points inside the cell, in
    1/256 steps, stored as the centre of the step (so a mirrored cell reads 1 - value); the slice
    channels move back by two; empty cells are 0."""
    pts = torch.tensor([
        [2.0 + 0.25 * 0.10, 1.0 + 0.25 * 0.30, 0.2, 10.0],
        [2.0 + 0.25 * 0.50, 1.0 + 0.25 * 0.90, 1.2, 10.0],
    ])
    out = voxelize_reference(pts, GRID_XY)
    plain = voxelize_reference(pts, GRID)
    ix, iy = 8, 16
    steps_x, steps_y = (int(0.10 * 256) + int(0.50 * 256)) / 2, (int(0.30 * 256) + int(0.90 * 256)) / 2
    assert GRID_XY.channel_names[5:7] == ("x_offset_mean", "y_offset_mean") and GRID_XY.n_channels == 15
    assert out[5, iy, ix].item() == pytest.approx((2 * math.floor(steps_x + 0.5) + 1) / 512, abs=1e-7)
    assert out[6, iy, ix].item() == pytest.approx((2 * math.floor(steps_y + 0.5) + 1) / 512, abs=1e-7)
    assert torch.equal(out[:5], plain[:5]) and torch.equal(out[7:], plain[5:])
    assert torch.count_nonzero(out[5:7].sum(0)) == 1
    # mirror: y -> -y about the grid centre line (y_range is symmetric): the y channel becomes 1 - y
    one = torch.tensor([[3.1, 1.0 + 0.25 * 0.3, 0.2, 10.0]])
    mirrored = one * torch.tensor([1.0, -1.0, 1.0, 1.0])
    a, b = voxelize_reference(one, GRID_XY), voxelize_reference(mirrored, GRID_XY)
    assert torch.allclose(b[6].flip(0)[a[0] > 0], 1 - a[6][a[0] > 0])
    assert torch.equal(b[5].flip(0), a[5])


def test_count_table_starts_at_zero_and_ends_at_one():
    """Kernel 2 skips reading the table for empty cells because entry 0 is exactly 0."""
    lut = GRID.count_lut()
    assert lut.dtype == np.float32 and lut[0] == 0.0 and lut[-1] == 1.0 and np.all(np.diff(lut) > 0)


def test_count_channel_saturates():
    pts = torch.tensor([[0.1, -2.9, 0.0, 0.0]]).repeat(1000, 1)
    out = voxelize_reference(pts, GRID)
    assert out[0, 0, 0].item() == 1.0
    assert out[0].max().item() == 1.0


def test_output_shape_is_fixed():
    for n in (0, 1, 17, 5000):
        assert voxelize(random_cloud(n, n), GRID, backend="cpu").shape == (13, 24, 32)


def test_real_horizon_scan_triton_equals_torch():
    from conftest import SHARED_DATA

    path = SHARED_DATA / "livox_horizon" / "livox_source.pcd"
    if not path.is_file():
        pytest.skip("shared Horizon scan not present")
    from livox_infer.decode.pointfiles import read_pcd

    points = torch.from_numpy(np.ascontiguousarray(read_pcd(path), dtype=np.float32))
    points[:, 2] += 0.9  # ground to z ~ 0 (see the data README)
    grid = GridConfig(x_range=(0.0, 40.0), y_range=(-20.0, 20.0), cell_size=0.5)
    ref = voxelize_reference(points, grid)
    assert torch.equal(triton_voxelize(points, grid), ref)
    assert ref[0].count_nonzero() > 500  # the scan really lands in the grid


# -- config and errors ---------------------------------------------------------------------------

def test_grid_config_roundtrip_and_shape():
    d = GRID.to_dict()
    assert GridConfig.from_dict(d) == GRID
    assert "xy_offsets" not in d  # absent when off: hashes of older grids (and their weights) stay valid
    assert GridConfig.from_dict(GRID_XY.to_dict()) == GRID_XY and GRID_XY.to_dict()["xy_offsets"] is True
    with pytest.raises(ConfigError, match="xy_offsets"):
        GridConfig.from_dict(d | {"xy_offsets": "yes"})
    assert GRID.shape == (5 + 8, 24, 32)
    assert len(GRID.channel_names) == GRID.n_channels
    assert GridConfig().shape[0] == 13


@pytest.mark.parametrize("bad", [
    {"cell_size": 0.3},  # 8 m / 0.3 is not whole
    {"cell_size": -1.0},
    {"z_quantum": 0.003},  # 4 m / 3 mm not whole
    {"n_height_slices": 7},  # 800 levels not divisible by 7
    {"n_height_slices": 0},
    {"x_range": (5.0, 5.0)},
    {"x_range": (0.0, math.inf)},
    {"y_range": "wide"},
    {"intensity_scale": 0.0},
    {"count_saturation": 0},
    {"cell_size": 1e-4},  # far too many cells
])
def test_grid_config_rejects_bad_values(bad):
    d = GRID.to_dict() | bad
    with pytest.raises(ConfigError):
        GridConfig.from_dict(d)


def test_grid_config_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown"):
        GridConfig.from_dict(GRID.to_dict() | {"cellsize": 0.2})


@pytest.mark.parametrize("bad", [torch.zeros(5, 3), torch.zeros(4), torch.zeros(2, 4, dtype=torch.bool), [[0, 0, 0, 0]]])
def test_bad_points_raise_point_cloud_error(bad):
    with pytest.raises(PointCloudError):
        voxelize(bad, GRID, backend="cpu")


def test_numpy_and_float64_points_are_accepted():
    pts = random_cloud(100, 20)
    ref = voxelize(pts, GRID, backend="cpu")
    assert torch.equal(voxelize(pts.numpy(), GRID, backend="cpu"), ref)
    assert torch.equal(voxelize(pts.double(), GRID, backend="cpu"), ref)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_backend_without_gpu_raises_backend_error():
    with pytest.raises(BackendError, match="GPU"):
        voxelize(torch.zeros(1, 4), GRID, backend="cuda")
    with pytest.raises(BackendError):
        Voxelizer(GRID, "cuda")
    assert voxelize(torch.zeros(1, 4), GRID, backend="auto").device.type == "cpu"


def test_unknown_backend_raises():
    with pytest.raises(BackendError):
        voxelize(torch.zeros(1, 4), GRID, backend="tpu")


def test_chunked_quantisation_gives_the_same_result(monkeypatch):
    """Clouds above TILED_ROWS_MAX are quantised in chunks (here 7 rows, last chunk partial)."""
    import livox_infer.voxelize.reference as reference

    points = torch.cat([random_cloud(3000, 30), extreme_cloud(), edge_cloud()])
    tiled = voxelize_reference(points, GRID)
    monkeypatch.setattr(reference, "TILED_ROWS_MAX", 7)
    assert torch.equal(voxelize_reference(points, GRID), tiled)
    assert torch.equal(triton_voxelize(points), tiled)


@pytest.mark.parametrize("n_points", [5, 200, 5000])  # representative-point search and grid scan
def test_occupied_cell_search_paths_agree_with_dense_reference(n_points):
    points = random_cloud(n_points, 40 + n_points, margin=0.2)
    assert torch.equal(voxelize_reference(points, GRID), voxelize_reference_dense(points, GRID))


def test_bench_voxelize_runs_on_cpu(capsys):
    import argparse

    from livox_infer.bench import voxelize as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--sizes", "100,2000", "--repeat", "3", "--warmup", "1", "--no-compile", "--device", "cpu"])
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "2,000" in out and "x eager" in out


@pytest.mark.slow  # ~25 s of inductor compile on a busy 2-core machine
def test_compiled_dense_reference_is_bit_identical():
    """torch.compile'd reference (what the benchmark compares against) == eager CPU path: inductor's
    fused C++ keeps the same float ops (no FMA contraction across the sub/mul)."""
    compiled = torch.compile(lambda p: voxelize_reference_dense(p, GRID), fullgraph=True, dynamic=False)
    points = torch.cat([clustered_cloud(50), extreme_cloud(), edge_cloud(), random_cloud(700, 51)])
    assert torch.equal(compiled(points), voxelize_reference(points, GRID))


def test_triton_backend_on_cpu_without_interpreter_raises(monkeypatch):
    import livox_infer.voxelize.voxelizer as voxelizer_module

    monkeypatch.setattr(voxelizer_module, "INTERPRETING", False)
    with pytest.raises(BackendError, match="TRITON_INTERPRET"):
        Voxelizer(GRID, "cpu", backend="triton")(random_cloud(10, 61))


def test_voxelizer_follows_to_device():
    v = Voxelizer(GRID, "cpu").to("cpu")
    points = random_cloud(300, 60)
    assert v.device.type == "cpu"
    assert torch.equal(v(points), voxelize_reference(points, GRID))


def test_the_cpu_path_does_not_import_triton():
    """Importing the pipeline (what the node and detect do) leaves triton and the kernels unimported: ~1.3 s of
    start-up a CPU-only node never needs; the GPU backend imports them on first use."""
    import subprocess
    import sys

    code = ("import sys, livox_infer.pipeline, livox_infer.voxelize; "
            "print(sorted(m for m in ('triton', 'livox_infer.voxelize.triton_kernels', "
            "'livox_infer.voxelize.fused_op') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the point-age channel of stacked frames (grid.age_channel_s) ---------------------------------

GRID_AGE = dataclasses.replace(GRID_XY, age_channel_s=0.5)


def test_age_channel_is_the_clamped_mean_age_and_triton_equals_torch():
    """With age_channel_s the fourth point column is an age in seconds: channel 4 ("age_mean") holds the cell's
    mean of min(age / age_channel_s, 1), on the same fixed-point path as intensity (Triton == torch, bit for bit)."""
    assert GRID_AGE.channel_names[4] == "age_mean" and GRID_AGE.shape == GRID_XY.shape
    pts = torch.tensor([
        [2.1, 1.1, 0.5, 0.0],  # newest frame
        [2.2, 1.2, 0.6, 0.1],  # 100 ms old
        [2.15, 1.05, 0.7, 0.2],
        [5.1, -1.1, 0.5, 3.0],  # older than age_channel_s: clamps to 1
    ])
    out = voxelize_reference(pts, GRID_AGE)
    assert out[4, 16, 8].item() == pytest.approx((0.0 + 0.2 + 0.4) / 3, abs=1e-4)
    assert out[4, 7, 20].item() == pytest.approx(1.0, abs=1e-6)
    cloud = random_cloud(5000, 7, GRID_AGE)
    cloud[:, 3] = torch.rand(5000, generator=torch.Generator().manual_seed(3)) * 0.7
    assert torch.equal(triton_voxelize(cloud, voxelizer=Voxelizer(GRID_AGE, "cpu", backend="triton")),
                       voxelize_reference(cloud, GRID_AGE))
    # the other channels do not depend on the fourth column
    same = torch.ones(15, dtype=torch.bool)
    same[4] = False
    torch.testing.assert_close(voxelize_reference(cloud, GRID_AGE)[same], voxelize_reference(cloud, GRID_XY)[same],
                               rtol=0, atol=0)


def test_age_channel_config():
    d = GRID_AGE.to_dict()
    assert d["age_channel_s"] == 0.5 and GridConfig.from_dict(d) == GRID_AGE
    assert "age_channel_s" not in GRID_XY.to_dict()  # absent when off: older grids keep their hash
    for bad in (0.0, -1.0, math.inf, 11.0, True, "0.5"):
        with pytest.raises(ConfigError, match="age_channel_s"):
            GridConfig.from_dict(d | {"age_channel_s": bad})
