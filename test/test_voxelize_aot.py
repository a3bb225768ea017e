"""The voxelizer kernels compile ahead of time, without a GPU, for NVIDIA Hopper (sm_90), Jetson
Orin (sm_87) and AMD MI300 (gfx942): the vendor-portable claim, checked in CPU CI.

`@triton.jit` returns an interpreter function when TRITON_INTERPRET=1 (set by conftest), so the
compile runs in a subprocess with the variable removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # AOT-compiles the Triton kernels for three GPU targets: ~25 s

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, os
assert "TRITON_INTERPRET" not in os.environ
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from livox_infer.voxelize.triton_kernels import accumulate_kernel, normalize_kernel

ACCUMULATE = {
    "points_ptr": "*fp32", "n_points": "i32", "n_points_ptr": "*i32",
    "count_ptr": "*i32", "z_max_ptr": "*i32", "z_min_ptr": "*i32", "occupancy_ptr": "*i32",
    "z_sum_ptr": "*i64", "intensity_sum_ptr": "*i64", "x_sum_ptr": "*i64", "y_sum_ptr": "*i64",
    "x_min": "fp32", "y_min": "fp32", "z_min": "fp32", "inv_cell": "fp32", "inv_z_quantum": "fp32",
    "intensity_mult": "fp32", "xy_levels": "fp32",
    "width": "i32", "height": "i32", "z_levels": "i32", "levels_per_slice": "i32",
    "N_FROM_PTR": "constexpr", "XY_OFFSETS": "constexpr", "BLOCK": "constexpr",
}
NORMALIZE = {
    "count_ptr": "*i32", "z_max_ptr": "*i32", "z_min_ptr": "*i32", "occupancy_ptr": "*i32",
    "z_sum_ptr": "*i64", "intensity_sum_ptr": "*i64", "x_sum_ptr": "*i64", "y_sum_ptr": "*i64",
    "count_lut_ptr": "*fp32", "out_ptr": "*fp32",
    "n_cells": "i32", "count_saturation": "i32", "inv_z_levels": "fp32", "inv_intensity_levels": "fp32",
    "inv_2_xy_levels": "fp32",
    "N_SLICES": "constexpr", "XY_OFFSETS": "constexpr", "BLOCK": "constexpr",
}
KERNELS = [
    ("accumulate", accumulate_kernel, ACCUMULATE, {"N_FROM_PTR": False, "XY_OFFSETS": False, "BLOCK": 256}),
    ("accumulate_n_from_ptr", accumulate_kernel, ACCUMULATE, {"N_FROM_PTR": True, "XY_OFFSETS": False, "BLOCK": 256}),
    ("accumulate_xy", accumulate_kernel, ACCUMULATE, {"N_FROM_PTR": True, "XY_OFFSETS": True, "BLOCK": 256}),
    ("normalize", normalize_kernel, NORMALIZE, {"N_SLICES": 8, "XY_OFFSETS": False, "BLOCK": 512}),
    ("normalize_xy", normalize_kernel, NORMALIZE, {"N_SLICES": 8, "XY_OFFSETS": True, "BLOCK": 512}),
]
TARGETS = [("cuda", 90, 32), ("cuda", 87, 32), ("hip", "gfx942", 64)]
result = {}
for backend, arch, warp in TARGETS:
    for name, fn, sig, constexprs in KERNELS:
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                                  target=GPUTarget(backend, arch, warp))
        key = "ptx" if backend == "cuda" else "amdgcn"
        result[f"{backend}:{arch}:{name}"] = {"asm": compiled.asm[key], "llir": compiled.asm["llir"]}

# The custom op must trace into ONE graph (no graph break) for torch.compile(fullgraph=True) on GPU.
import torch
from livox_infer.voxelize import GridConfig, Voxelizer
grid = GridConfig(x_range=(0.0, 8.0), y_range=(-3.0, 3.0), cell_size=0.25, xy_offsets=True)
# export traces without running (there is no GPU) and fails on any graph break
graph, _guards = torch._dynamo.export(Voxelizer(grid, "cpu", backend="triton"))(torch.rand(100, 4))
result["dynamo"] = {"code": graph.code}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ["90", "87"])
def test_nvidia_ptx_is_produced_with_integer_atomics(compiled, arch):
    ptx = compiled[f"cuda:{arch}:accumulate"]["asm"]
    assert f".target sm_{arch}" in ptx
    for op in ("atom.global.gpu.relaxed.add.u32", "max.s32", "min.s32", "or.b32", "add.u64"):
        assert op in ptx, op
    assert not any("atom" in line and ".f32" in line for line in ptx.splitlines()), "float atomics"
    assert ".entry normalize_kernel" in compiled[f"cuda:{arch}:normalize"]["asm"]
    # the sub-cell x/y variant adds two 64-bit integer atomic adds (x_sum, y_sum) to the two of z_sum and
    # intensity_sum, and nothing in float
    atom64 = lambda asm: sum("atom" in ln and "add.u64" in ln for ln in asm.splitlines())  # noqa: E731
    xy = compiled[f"cuda:{arch}:accumulate_xy"]["asm"]
    assert atom64(xy) == 2 * atom64(compiled[f"cuda:{arch}:accumulate_n_from_ptr"]["asm"]) > 0
    assert not any("atom" in line and ".f32" in line for line in xy.splitlines())


def test_amd_gcn_is_produced_with_integer_atomics(compiled):
    gcn = compiled["hip:gfx942:accumulate"]["asm"]
    assert "gfx942" in gcn
    for op in ("global_atomic_add", "global_atomic_smax", "global_atomic_smin", "global_atomic_or",
               "global_atomic_add_x2"):
        assert op in gcn, op
    assert "normalize_kernel" in compiled["hip:gfx942:normalize"]["asm"]


def test_no_fused_multiply_add_in_float_math(compiled):
    """Bit-identity with the CPU path needs each float op rounded on its own: no fma in the IR."""
    for key, c in compiled.items():
        if key == "dynamo":
            continue
        assert "llvm.fma" not in c["llir"] and "fmuladd" not in c["llir"], key
        if key.startswith("cuda"):
            assert "fma.rn.f32" not in c["asm"], key


def test_voxelizer_op_traces_into_one_graph(compiled):
    """torch.compile(fullgraph=True) prerequisite, checked on CPU: dynamo captures the triton_op
    (kernel launches + buffer mutation) in a single graph with no break."""
    code = compiled["dynamo"]["code"]
    assert code.count("torch.ops.livox_infer.voxelize_fused") == 1
    assert "self.L__self___acc_count" in code  # the accumulators enter as module buffers
