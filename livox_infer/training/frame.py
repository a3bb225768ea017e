"""One training frame (simulated or a real labelled view), as the training loop and the datasets share it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from livox_infer.ground import Mount


@dataclass
class Frame:
    points: np.ndarray  # (N, 4) f32, sensor frame, no-returns dropped, cropped to the grid + margin
    boxes: np.ndarray  # (M, 7) f32 sensor frame
    labels: np.ndarray  # (M,) int64
    sensor_height: float  # metres to the ground plane
    up: np.ndarray  # (3,) ground-plane normal in the sensor frame
    sensor: str

    @property
    def mount(self) -> Mount:
        return Mount(float(self.sensor_height), tuple(float(v) for v in self.up))
