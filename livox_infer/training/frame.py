"""One training frame (simulated or a real labelled view), as the training loop and the datasets share it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from livox_infer.ground import Mount, estimate_mount


@dataclass
class Frame:
    points: np.ndarray  # (N, 4) f32, sensor frame, no-returns dropped, cropped to the grid + margin
    boxes: np.ndarray  # (M, 7) f32 sensor frame
    labels: np.ndarray  # (M,) int64
    sensor_height: float  # metres to the ground plane
    up: np.ndarray  # (3,) ground-plane normal in the sensor frame
    sensor: str
    # (N,) f32 seconds each point lies before the newest frame of a stacked sample (training/stacked.py); None:
    # a single frame (all 0)
    age: np.ndarray | None = None
    real: bool = False  # a view of a real labelled scan (training/real_frames.py), not a simulated frame

    @property
    def mount(self) -> Mount:
        return Mount(float(self.sensor_height), tuple(float(v) for v in self.up))


def points_with_age(frame: Frame) -> np.ndarray:
    """A copy of the frame's points with the fourth column replaced by the point ages (0 for a single frame): what
    a model with ``grid.age_channel_s`` is fed where others get intensity."""
    pts = frame.points.copy()
    pts[:, 3] = 0.0 if frame.age is None else frame.age
    return pts


def sim_returns(f) -> np.ndarray:
    """Mask of a SimFrame's real, finite returns (no-returns are (0, 0, 0) rows)."""
    pts = np.asarray(f.points, np.float32)
    return np.any(pts[:, :3] != 0, axis=1) & np.all(np.isfinite(pts), axis=1)


def training_mount(points: np.ndarray, f) -> Mount:
    """The mount a training sample is levelled with: estimated from ``points`` as the pipeline's "auto" mode
    does, or SimFrame ``f``'s true one (sensor height, world up from the pose) when that fails."""
    est = estimate_mount(points)
    if est is None or abs(est.height - f.sensor_height) > 0.5:
        est = Mount(float(f.sensor_height), tuple(float(v) for v in np.asarray(f.pose)[2, :3]))
    return est
