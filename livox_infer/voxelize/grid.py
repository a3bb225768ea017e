"""`GridConfig`: the BEV grid a model is trained on, and the fixed-point constants both voxelizer
backends (Triton kernels, plain torch) derive from it.

Every float constant the backends use is rounded to float32 HERE, once, so the Triton kernels
(which receive Python floats as fp32 scalars) and the torch path (which uses 0-dim float32 tensors)
compute with exactly the same values; that is half of what makes the two paths bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from livox_infer.errors import ConfigError

# Fixed-channel layout (see livox_infer/voxelize/__init__.py for the meaning of each).
CH_COUNT, CH_Z_MAX, CH_Z_MIN, CH_Z_MEAN, CH_INTENSITY = 0, 1, 2, 3, 4
N_FIXED_CHANNELS = 5
FIXED_CHANNEL_NAMES = ("log_count", "z_max", "z_min", "z_mean", "intensity_mean")

# Optional sub-cell position channels (grid.xy_offsets): where in its cell a point lies, x and y,
# each in this many steps of the cell (a 0.4 m cell: 1.6 mm steps); the channels hold the mean.
XY_OFFSET_LEVELS = 256
XY_OFFSET_CHANNEL_NAMES = ("x_offset_mean", "y_offset_mean")

# With grid.age_channel_s the points' fourth column carries each point's age (seconds before the newest frame
# of a stacked cloud) instead of intensity, and channel 4 is its cell mean, clamped at age_channel_s (1.0).
AGE_CHANNEL_NAME = "age_mean"
MAX_AGE_CHANNEL_S = 10.0

# Intensity is quantised to this many steps of [0, 1] (intensity / intensity_scale, clamped).
INTENSITY_LEVELS = 65535
# Largest point count one call accepts. Keeps 4*N flat offsets inside int32 in the kernels
# and every per-cell sum far inside int64 (see `GridConfig.check_capacity`).
MAX_POINTS = 1 << 28
# Grid-size limits: the flat cell index is int32 and z sums are int64.
MAX_CELLS = 1 << 24
MAX_Z_LEVELS = 1 << 20
MAX_HEIGHT_SLICES = 30  # one bit per slice in an int32 occupancy mask (bit 31 left alone)

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def f32(value: float) -> float:
    """`value` rounded to the nearest float32, returned as a Python float (exactly representable)."""
    return float(np.float32(value))


def _whole(value: float, what: str) -> int:
    n = round(value)
    if n < 1 or abs(value - n) > 1e-6 * max(1.0, abs(value)):
        raise ConfigError(f"{what} must be a positive whole number, got {value!r}")
    return int(n)


def _pair(value: Any, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be two numbers [min, max], got {value!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(f"{name} must be finite with min < max, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class GridConfig:
    """Bird's-eye-view grid: which points count and how they become the (C, H, W) input tensor.

    tensor[c, iy, ix] with ix = floor((x - x_min) / cell_size) along W and
    iy = floor((y - y_min) / cell_size) along H. The pipeline shifts z so the ground is at z ~ 0
    before voxelizing. Points outside x_range/y_range/z_range (max exclusive) are ignored.
    """

    x_range: tuple[float, float] = (0.0, 76.8)
    y_range: tuple[float, float] = (-38.4, 38.4)
    z_range: tuple[float, float] = (-0.5, 3.5)
    cell_size: float = 0.2
    n_height_slices: int = 8
    intensity_scale: float = 255.0  # raw intensity / intensity_scale -> [0, 1] (Livox reflectivity: 255)
    z_quantum: float = 0.005  # metres per fixed-point z step
    count_saturation: int = 255  # count channel = log1p(min(count, sat)) / log1p(sat)
    # Two more channels after the fixed five: mean position of the cell's points inside the cell
    # (x, y), so the network sees object edges to ~cm instead of to a whole cell.
    xy_offsets: bool = False
    # Stacked frames (issue 32): channel 4 holds the cell's mean point age / age_channel_s (clamped to 1) instead
    # of the mean intensity; the voxelizer's fourth point column then carries the age in seconds. None: intensity.
    age_channel_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "x_range", _pair(self.x_range, "x_range"))
        object.__setattr__(self, "y_range", _pair(self.y_range, "y_range"))
        object.__setattr__(self, "z_range", _pair(self.z_range, "z_range"))
        for name in ("cell_size", "intensity_scale", "z_quantum"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name} must be a positive finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        age = self.age_channel_s
        if age is not None:
            if isinstance(age, bool) or not isinstance(age, (int, float)) or not (
                    math.isfinite(age) and 0 < age <= MAX_AGE_CHANNEL_S):
                raise ConfigError(f"age_channel_s must be a number of seconds in (0, {MAX_AGE_CHANNEL_S:g}] or "
                                  f"absent, got {age!r}")
            object.__setattr__(self, "age_channel_s", float(age))
        if not isinstance(self.xy_offsets, bool):
            raise ConfigError(f"xy_offsets must be true or false, got {self.xy_offsets!r}")
        for name, hi in (("n_height_slices", MAX_HEIGHT_SLICES), ("count_saturation", 1 << 20)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ConfigError(f"{name} must be an integer in [1, {hi}], got {v!r}")
        w, h = self.width, self.height
        if w * h > MAX_CELLS:
            raise ConfigError(f"grid has {w}x{h} cells, more than the {MAX_CELLS} supported")
        levels = self.z_levels
        if levels > MAX_Z_LEVELS:
            raise ConfigError(f"z_range/z_quantum gives {levels} z levels, more than {MAX_Z_LEVELS}")
        if levels % self.n_height_slices:
            raise ConfigError(
                f"z levels ({levels} = z extent / z_quantum) must be divisible by n_height_slices "
                f"({self.n_height_slices}) so slices are whole numbers of z quanta"
            )

    # -- shape -------------------------------------------------------------------------------
    @property
    def width(self) -> int:
        """W: number of x cells."""
        return _whole((self.x_range[1] - self.x_range[0]) / self.cell_size, "x extent / cell_size")

    @property
    def height(self) -> int:
        """H: number of y cells."""
        return _whole((self.y_range[1] - self.y_range[0]) / self.cell_size, "y extent / cell_size")

    @property
    def region(self) -> tuple[float, float, float, float]:
        """(x_min, x_max, y_min, y_max): the BEV area the grid covers (evaluation's default region)."""
        return (self.x_range[0], self.x_range[1], self.y_range[0], self.y_range[1])

    @property
    def z_levels(self) -> int:
        return _whole((self.z_range[1] - self.z_range[0]) / self.z_quantum, "z extent / z_quantum")

    @property
    def levels_per_slice(self) -> int:
        return self.z_levels // self.n_height_slices

    @property
    def slice_channel_start(self) -> int:
        """Index of the first height-slice channel (after the fixed and the optional x/y channels)."""
        return N_FIXED_CHANNELS + (2 if self.xy_offsets else 0)

    @property
    def n_channels(self) -> int:
        return self.slice_channel_start + self.n_height_slices

    @property
    def n_cells(self) -> int:
        return self.width * self.height

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the voxelized tensor."""
        return (self.n_channels, self.height, self.width)

    @property
    def channel_names(self) -> tuple[str, ...]:
        xy = XY_OFFSET_CHANNEL_NAMES if self.xy_offsets else ()
        fixed = FIXED_CHANNEL_NAMES if self.age_channel_s is None else FIXED_CHANNEL_NAMES[:4] + (AGE_CHANNEL_NAME,)
        return fixed + xy + tuple(f"slice_{k}" for k in range(self.n_height_slices))

    # -- fixed-point constants shared by both backends ------------------------------------------
    def kernel_constants(self) -> dict[str, float | int]:
        """Scalars of the fused kernel, floats already float32-exact."""
        return {
            "x_min": f32(self.x_range[0]),
            "y_min": f32(self.y_range[0]),
            "z_min": f32(self.z_range[0]),
            "inv_cell": f32(1.0 / self.cell_size),
            "inv_z_quantum": f32(1.0 / self.z_quantum),
            # the fourth column's scale to its 0..INTENSITY_LEVELS steps: intensity / intensity_scale, or age in
            # seconds / age_channel_s (both clamped to 1)
            "intensity_mult": f32(INTENSITY_LEVELS / (self.intensity_scale if self.age_channel_s is None
                                                      else self.age_channel_s)),
            "width": self.width,
            "height": self.height,
            "z_levels": self.z_levels,
            "levels_per_slice": self.levels_per_slice,
            "inv_z_levels": f32(1.0 / self.z_levels),
            "inv_intensity_levels": f32(1.0 / INTENSITY_LEVELS),
            "count_saturation": self.count_saturation,
            "xy_levels": f32(XY_OFFSET_LEVELS),
            "inv_2_xy_levels": f32(0.5 / XY_OFFSET_LEVELS),
        }

    def count_lut(self) -> np.ndarray:
        """float32 table: count (0..saturation) -> log1p(count) / log1p(saturation).

        A table instead of calling log in the kernel: log differs between CUDA, ROCm and CPU
        math libraries, a gathered constant does not."""
        c = np.arange(self.count_saturation + 1, dtype=np.float64)
        return (np.log1p(c) / np.log1p(self.count_saturation)).astype(np.float32)

    # -- (de)serialisation for the model YAML ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("x_range", "y_range", "z_range"):
            d[k] = list(d[k])
        if not self.xy_offsets:  # absent when off, so grids (and weights) from before it keep their hash
            del d["xy_offsets"]
        if self.age_channel_s is None:  # likewise
            del d["age_channel_s"]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GridConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"grid config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown grid config keys {unknown}; known: {sorted(known)}")
        return cls(**data)
