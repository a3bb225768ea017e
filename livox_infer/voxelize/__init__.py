"""Point cloud -> fixed-shape BEV tensor, one fused Triton pass on GPU, bit-identical plain torch on CPU.

Input: points (N, 4) float32 ``[x, y, z, intensity]`` (z shifted so the ground is at z ~ 0).
Output: float32 tensor of shape ``grid.shape == (C, H, W)``, ``C = 5 + grid.n_height_slices``,
``tensor[c, iy, ix]`` with ``ix = floor((x - x_min) / cell_size)`` (W axis) and
``iy = floor((y - y_min) / cell_size)`` (H axis).

A point is inside iff ``0 <= (x - x_min) * (1/cell) < W``, same for y/H, and
``0 <= (z - z_min) * (1/z_quantum) < z_levels`` (all in float32; the upper bounds are exclusive);
other points, including +-inf, huge values and NaN in any field, are ignored.
Empty cells are 0 in every channel. Channels (all in [0, 1]):

====  ==================  =========================================================================
 c    name                value for an occupied cell
====  ==================  =========================================================================
 0    log_count           log1p(min(count, count_saturation)) / log1p(count_saturation)
 1    z_max               z level of the highest point / z_levels      ((z - z_min) / z extent)
 2    z_min               z level of the lowest point / z_levels
 3    z_mean              rounded mean z level / z_levels
 4    intensity_mean      rounded mean of clamp(intensity / intensity_scale, 0, 1), 1/65535 steps
      (age_mean)          with grid.age_channel_s: the fourth point column is the point's age in
                          seconds (stacked frames) and this is the mean of clamp(age / age_channel_s, 0, 1)
 5+k  slice_k             1.0 if any point lies in height slice k (z extent split into
                          n_height_slices equal slices, k = 0 lowest), else 0.0
====  ==================  =========================================================================

z level = floor((z - z_min) / z_quantum) (z_quantum = 5 mm by default). Everything per cell is
accumulated in integer fixed point, so the result does not depend on point order and the Triton and
torch paths agree bit for bit.

API: `GridConfig`, `voxelize(points, grid, backend="auto"|"cpu"|"cuda")`, `Voxelizer` (nn.Module
owning the accumulators as buffers), `voxelize_reference` (plain torch).
"""

from livox_infer.voxelize.grid import GridConfig
from livox_infer.voxelize.reference import voxelize_reference
from livox_infer.voxelize.voxelizer import Voxelizer, voxelize

__all__ = ["GridConfig", "Voxelizer", "voxelize", "voxelize_reference"]
