"""`Voxelizer` module and the `voxelize()` entry point.

On GPU the two Triton kernels run through the `livox_infer::voxelize_fused` custom op (`fused_op.py`:
`torch.library.triton_op` + `wrap_triton`), so the op composes with torch.compile(fullgraph=True).
The accumulators are registered buffers of `Voxelizer`: CUDA-graph trees skip graphs that mutate
a tensor passed in as a graph input, but mutating buffers of the compiled module is fine.
On CPU the module runs the plain-torch reference (the Triton interpreter cannot run inside
torch.compile), which gives bit-identical results.
"""

from __future__ import annotations

import functools
import os
import threading
import numpy as np
import torch

from livox_infer.errors import BackendError, PointCloudError
from livox_infer.voxelize.grid import MAX_POINTS, GridConfig
from livox_infer.voxelize.reference import (
    ReferenceConstants,
    new_reference_state,
    voxelize_reference,
)

# TRITON_INTERPRET=1 (set before import) runs the Triton kernels on CPU tensors, for tests (triton_kernels reads it too)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def _fused_op():
    """The Triton op's module, imported (the op registered) on first use: triton and the kernels cost ~1.3 s of
    start-up that the CPU path never needs."""
    from livox_infer.voxelize import fused_op

    return fused_op


def check_points(points: torch.Tensor | np.ndarray, device: torch.device | None = None) -> torch.Tensor:
    """(N, 4) points as a contiguous float32 tensor (on `device` if given), or PointCloudError."""
    if isinstance(points, np.ndarray):
        points = torch.from_numpy(points)
    if not isinstance(points, torch.Tensor):
        raise PointCloudError(f"points must be a torch.Tensor or numpy array, got {type(points).__name__}")
    if points.ndim != 2 or points.shape[1] != 4:
        raise PointCloudError(f"points must have shape (N, 4) [x, y, z, intensity], got {tuple(points.shape)}")
    if points.dtype.is_complex or points.dtype == torch.bool:
        raise PointCloudError(f"points must be real numbers, got dtype {points.dtype}")
    if points.shape[0] > MAX_POINTS:
        raise PointCloudError(f"{points.shape[0]} points is more than the {MAX_POINTS} one call accepts")
    return points.to(device=device, dtype=torch.float32).contiguous()


def resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendError("the cuda backend was requested but torch sees no GPU (torch.cuda.is_available() is False)")
    return device


class Voxelizer(torch.nn.Module):
    """forward(points (N, 4)) -> (C, H, W) float32 on `device`.

    backend "triton" runs the fused kernels (the default on GPU; on CPU only under
    TRITON_INTERPRET=1, for tests), "torch" the plain-torch reference (the default on CPU).
    The accumulators are buffers in their reset state between calls, so one Voxelizer must not
    be called from two threads or CUDA streams at once (`voxelize()` serialises its cached ones).
    """

    def __init__(self, grid: GridConfig, device: torch.device | str | None = "auto", backend: str = "auto") -> None:
        super().__init__()
        self.grid = grid
        device = resolve_device(device)
        if backend == "auto":
            backend = "triton" if device.type == "cuda" else "torch"
        if backend not in ("triton", "torch"):
            raise BackendError(f"unknown voxelizer backend {backend!r}; use 'auto', 'triton' or 'torch'")
        self.backend = backend
        self.constants = grid.kernel_constants()
        self.register_buffer("count_lut", torch.from_numpy(grid.count_lut()).to(device), persistent=False)
        self._reference_constants: ReferenceConstants | None = None
        if backend == "triton":
            _fused_op()  # registers torch.ops.livox_infer.voxelize_fused
            from livox_infer.voxelize.triton_kernels import new_accumulators

            for name, t in new_accumulators(grid, device).items():
                self.register_buffer(f"acc_{name}", t, persistent=False)
        else:
            state = new_reference_state(grid, device)
            self._state_names = tuple(state)
            for name, t in state.items():
                self.register_buffer(f"ref_{name}", t, persistent=False)

    @property
    def device(self) -> torch.device:
        """Where the buffers are (follows `.to()` / `.cuda()`)."""
        return self.count_lut.device

    @property
    def reference_constants(self) -> ReferenceConstants:
        if self._reference_constants is None or self._reference_constants.count_lut.device != self.device:
            self._reference_constants = ReferenceConstants(self.grid, self.device)
        return self._reference_constants

    def reference_state(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, f"ref_{name}") for name in self._state_names}

    def accumulators(self) -> dict[str, torch.Tensor]:
        from livox_infer.voxelize.triton_kernels import ACCUMULATOR_NAMES

        return {name: getattr(self, f"acc_{name}") for name in ACCUMULATOR_NAMES}

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        device = self.device
        points = check_points(points, device)
        if self.backend == "torch":
            return voxelize_reference(points, self.grid, self.reference_constants, self.reference_state())
        if torch.compiler.is_compiling():
            return self._fused(points)
        if device.type == "cuda":
            # Triton launches on the current device; inductor sets the device itself when compiled.
            with torch.cuda.device(device):
                return self._fused(points)
        if not INTERPRETING:
            raise BackendError(
                "the triton voxelizer backend needs a GPU (on CPU it runs only in the Triton interpreter, "
                "TRITON_INTERPRET=1, for tests); use backend='torch' or 'auto' on CPU"
            )
        return self._fused(points)

    def _fused(self, points: torch.Tensor) -> torch.Tensor:
        k = self.constants
        return torch.ops.livox_infer.voxelize_fused(
            points, *self.accumulators().values(), self.count_lut,
            k["x_min"], k["y_min"], k["z_min"], k["inv_cell"], k["inv_z_quantum"], k["intensity_mult"],
            k["width"], k["height"], k["z_levels"], k["levels_per_slice"], k["count_saturation"],
            k["inv_z_levels"], k["inv_intensity_levels"], self.grid.n_height_slices,
            k["xy_levels"], k["inv_2_xy_levels"], self.grid.xy_offsets,
        )

    def cuda_graph(self, capacity: int) -> "CudaGraphVoxelizer":
        """A CUDA-graph replay of the two launches for clouds of up to `capacity` points."""
        return CudaGraphVoxelizer(self, capacity)


class CudaGraphVoxelizer:
    """Both kernels captured once in a CUDA graph; each call copies the points into a static
    buffer, writes N on the device and replays. The returned tensor is a static buffer that the
    next call overwrites (clone it to keep it)."""

    def __init__(self, voxelizer: Voxelizer, capacity: int) -> None:
        if voxelizer.device.type != "cuda" or voxelizer.backend != "triton":
            raise BackendError("CUDA-graph voxelizing needs a Voxelizer with device cuda and backend triton")
        if not 1 <= capacity <= MAX_POINTS:
            raise PointCloudError(f"capacity must be in [1, {MAX_POINTS}], got {capacity}")
        self.voxelizer, self.capacity = voxelizer, capacity
        dev = voxelizer.device
        self.points = torch.zeros((capacity, 4), dtype=torch.float32, device=dev)
        self.n_points = torch.zeros(1, dtype=torch.int32, device=dev)
        self.out = torch.empty(voxelizer.grid.shape, dtype=torch.float32, device=dev)
        with torch.cuda.device(dev):
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # first launch compiles the kernels, outside the capture
                self._launch()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._launch()

    def _launch(self) -> None:
        v = self.voxelizer
        _fused_op().launch_kernels(
            lambda kernel: kernel, self.points, 0, self.n_points, self.capacity, v.accumulators(),
            v.count_lut, self.out, v.constants, v.grid.n_height_slices, v.grid.xy_offsets,
        )

    def __call__(self, points: torch.Tensor) -> torch.Tensor:
        points = check_points(points)
        n = points.shape[0]
        if n > self.capacity:
            raise PointCloudError(f"{n} points exceed this CUDA graph's capacity of {self.capacity}")
        with torch.cuda.device(self.voxelizer.device):
            self.points[:n].copy_(points, non_blocking=True)
            self.n_points.fill_(n)
            self.graph.replay()
        return self.out


@functools.lru_cache(maxsize=8)
def _cached_voxelizer(grid: GridConfig, device: str) -> tuple[Voxelizer, threading.Lock]:
    # The lock keeps two threads' kernel pairs from interleaving on the shared accumulators.
    return Voxelizer(grid, device), threading.Lock()


@functools.lru_cache(maxsize=8)
def _cached_reference_constants(grid: GridConfig) -> ReferenceConstants:
    return ReferenceConstants(grid, "cpu")


def voxelize(points: torch.Tensor | np.ndarray, grid: GridConfig, backend: str = "auto") -> torch.Tensor:
    """(N, 4) float32 [x, y, z, intensity] -> (C, H, W) float32 (see the package docstring).

    backend: "cpu" (plain torch, result on CPU), "cuda" (Triton kernels, result on the current
    GPU; BackendError without one), "auto" (cuda when available, else cpu)."""
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    if backend == "cpu":
        return voxelize_reference(check_points(points, torch.device("cpu")), grid, _cached_reference_constants(grid))
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(
                "voxelize(backend='cuda') needs a GPU, but torch sees none (torch.cuda.is_available() is "
                "False); use backend='cpu' or 'auto'"
            )
        voxelizer, lock = _cached_voxelizer(grid, f"cuda:{torch.cuda.current_device()}")
        with lock:  # (kernels run in stream order, so enqueueing both under the lock suffices)
            return voxelizer(points)
    raise BackendError(f"unknown backend {backend!r}; use 'auto', 'cpu' or 'cuda'")
