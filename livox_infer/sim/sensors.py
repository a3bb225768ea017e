"""Livox sensor models: scan patterns, point rates, range limits.

Directions are generated in angular coordinates (azimuth ``az`` about +z, elevation ``el`` above the
x-y plane, degrees) and turned into unit vectors in the sensor frame (REP-103: x forward, y left, z up):
``d = (cos el cos az, cos el sin az, sin el)``.

Patterns (all continue in time across frames: frame k covers ``[k*period, (k+1)*period)`` of one
continuous trajectory, so non-repetitive patterns differ frame to frame and fill in over time):

* ``rosette`` (Mid-40, Mid-70, Tele-15, Avia): first-order model of a Risley pair: two wedge prisms
  spinning in opposite directions add two rotating deflection vectors of equal length,
  ``D(t) = A/2 (e^{i w1 t} + e^{i w2 t})``. The Mid-40 prism speeds (7294 rpm and -4664 rpm) are the
  published ones; the others use nearby incommensurable speeds. Density peaks at the FOV centre
  (retina-like) as on the real sensors.
* ``horizon`` (Horizon): shape measured from real Horizon recordings (/work/shared/data): six lasers
  with fixed angular offsets (about 1 deg apart in elevation) sweep horizontally together in a rounded
  triangle wave (about 70 Hz); elevation is a square-ish wave locked to the sweep (lower on the
  leftward sweep, higher on the rightward one) plus a slow ~5 Hz drift that fills the vertical FOV.
  Extents follow the datasheet (81.7 x 25.1 deg; the recordings are deskewed accumulations of a
  turning vehicle, so they spread wider in azimuth).
* ``spin`` (training proxies, not Livox): a spinning multi-beam LiDAR (Velodyne HDL-64E / VLP-32C,
  Ouster OS1-64 style): fixed beam elevations, columns at a fixed azimuth step, 10 Hz. Only the
  columns inside the forward cone ``fov_h_deg`` are fired (what a forward Livox sees), in sweep order.
  Training on ring patterns too keeps the detector from fitting one scan pattern; they are also the
  sensors of the real labelled scans (KITTI, Argoverse 2) the detector is validated on.
  ``spinrand`` is a different spinning LiDAR for every seed (`random_spin_sensor`): 16-128 beams, evenly
  spaced or bunched around the horizon as on 32/40-beam automotive sensors (VLP-32C, Pandar40), or in two
  blocks (HDL-64E), with its own vertical FOV, column step, range and beam width, so that the detector does
  not learn the three proxies' ring spacings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from livox_infer.errors import ConfigError

TWO_PI = 2.0 * np.pi


@dataclass(frozen=True)
class SensorModel:
    """One Livox model. Angles in degrees, ranges in metres, rates in points per second."""

    name: str
    point_rate: float
    n_lines: int
    fov_shape: str  # "circle" (off-axis angle <= fov_h/2) or "rect" (|az| <= h/2, |el| <= v/2)
    fov_h_deg: float  # datasheet horizontal FOV
    fov_v_deg: float  # datasheet vertical FOV
    pattern: str  # "rosette" or "horizon"
    range_min: float
    range_at_10pct: float  # max range on a 10 % reflectance target
    range_at_80pct: float  # max range on an 80 % reflectance target
    range_noise: float = 0.02  # 1 sigma, m
    angle_noise_deg: float = 0.03  # 1 sigma per axis, truncated at 2 sigma
    beam_divergence_deg: float = 0.1
    # rosette: prism rotation frequencies (Hz) and half-axes of the deflection ellipse (deg)
    prism_hz: tuple[float, float] = (121.5667, -77.7333)
    half_axes_deg: tuple[float, float] = (0.0, 0.0)
    # per-line angular offsets (deg): (az, el) for each laser
    line_offsets_deg: tuple[tuple[float, float], ...] = ((0.0, 0.0),)
    # horizon-style sweep parameters
    sweep_hz: float = 0.0
    sweep_half_deg: float = 0.0
    sweep_center_deg: float = 0.0
    step_half_deg: float = 0.0
    drift_hz: float = 0.0
    drift_half_deg: float = 0.0
    # spin: beam elevations (deg) and azimuth step between columns (deg); one rotation per period
    beam_elevations_deg: tuple[float, ...] = ()
    az_step_deg: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ bounds
    @property
    def max_abs_az_deg(self) -> float:
        """Largest |azimuth| the pattern can produce (including angle noise)."""
        noise = 2.0 * self.angle_noise_deg
        if self.pattern == "spin":
            return self.fov_h_deg / 2 + noise
        if self.pattern == "horizon":
            off = max(abs(o[0]) for o in self.line_offsets_deg)
            return abs(self.sweep_center_deg) + self.sweep_half_deg * 1.03 + off + noise
        off = max(abs(o[0]) for o in self.line_offsets_deg)
        return self.half_axes_deg[0] + off + noise

    @property
    def max_abs_el_deg(self) -> float:
        noise = 2.0 * self.angle_noise_deg
        if self.pattern == "spin":
            return max(abs(e) for e in self.beam_elevations_deg) + noise
        off = max(abs(o[1]) for o in self.line_offsets_deg)
        if self.pattern == "horizon":
            return self.step_half_deg + self.drift_half_deg + off + noise
        return self.half_axes_deg[1] + off + noise

    def points_per_frame(self, period: float = 0.1) -> int:
        if self.pattern == "spin":
            return self._spin_columns() * len(self.beam_elevations_deg)
        return int(round(self.point_rate * period))

    def _spin_columns(self) -> int:
        return int(round(self.fov_h_deg / self.az_step_deg))

    def max_range(self, reflectance: np.ndarray) -> np.ndarray:
        """Detection range limit for a target of effective reflectance (0..1): R ~ sqrt(rho),
        fitted through the two datasheet points."""
        rho = np.clip(reflectance, 1e-3, 0.8)  # datasheet range is the limit even for retro-reflectors
        # log-log line through (0.1, R10) and (0.8, R80)
        slope = np.log(self.range_at_80pct / self.range_at_10pct) / np.log(8.0)
        return self.range_at_10pct * (rho / 0.1) ** slope

    # ---------------------------------------------------------------- pattern
    def pattern_phases(self, seed: int) -> np.ndarray:
        """Per-unit random phases so different seeds scan differently; fixed for one seed."""
        return np.random.default_rng([int(seed), 7919]).uniform(0.0, TWO_PI, size=4)

    def angles(self, t: np.ndarray, line: np.ndarray, phases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nominal azimuth and elevation (deg) of each shot at absolute scan time ``t`` (s) on laser ``line``."""
        offsets = np.asarray(self.line_offsets_deg, dtype=np.float64)
        off_az = offsets[line, 0]
        off_el = offsets[line, 1]
        if self.pattern == "rosette":
            a = TWO_PI * self.prism_hz[0] * t + phases[0]
            b = TWO_PI * self.prism_hz[1] * t + phases[1]
            # two equal rotating deflections -> rosette through the centre; |D| <= 1
            dx = 0.5 * (np.cos(a) + np.cos(b))
            dy = 0.5 * (np.sin(a) + np.sin(b))
            az = self.half_axes_deg[0] * dx + off_az
            el = self.half_axes_deg[1] * dy + off_el
        elif self.pattern == "horizon":
            psi = TWO_PI * self.sweep_hz * t + phases[0]
            k = 0.985  # rounds the triangle's turning points
            tri = np.arcsin(k * np.sin(psi)) / np.arcsin(k)
            # slow modulation of the sweep width (real sweeps reach 35..60 deg)
            width = self.sweep_half_deg * (1.0 + 0.03 * np.sin(TWO_PI * 1.3 * t + phases[2]))
            az = self.sweep_center_deg + width * tri + off_az
            step = np.tanh(3.0 * np.cos(psi)) / np.tanh(3.0)
            # the slow drift advances mostly at the turnarounds, so each sweep stays nearly level
            # (ground returns form arcs of constant range, as in real Horizon scans)
            s = (psi - np.pi / 2) / np.pi  # integer at the turnarounds
            m = np.round(s)
            w = 0.08  # width of the step, in sweeps
            stair = m + 0.5 * np.tanh((s - m) / w) / np.tanh(0.5 / w)
            t_stair = (stair * np.pi + np.pi / 2 - phases[0]) / (TWO_PI * self.sweep_hz)
            drift = np.sin(TWO_PI * self.drift_hz * t_stair + phases[1])
            el = self.step_half_deg * step + self.drift_half_deg * drift + off_el
        else:  # pragma: no cover - guarded by the SENSORS table
            raise ConfigError(f"unknown scan pattern {self.pattern!r}")
        return az, el

    def shots(self, frame_index: int, period: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All shots of one frame: (time from frame start (N,) f64, line (N,) u8, unit directions (N,3) f64).

        Lasers fire interleaved (shot i on line i % n_lines), as the Livox driver orders them.
        A ``spin`` sensor fires all beams of a column together, columns sweeping right to left (+az)
        through the cone; each frame starts at a random phase offset within one column step.
        """
        if self.pattern == "spin":
            return self._spin_shots(int(frame_index), period, seed)
        n = self.points_per_frame(period)
        rel_t = np.arange(n, dtype=np.float64) / self.point_rate
        abs_t = frame_index * period + rel_t
        line = (np.arange(n) % self.n_lines).astype(np.uint8)
        az, el = self.angles(abs_t, line, self.pattern_phases(seed))
        return rel_t, line, angles_to_dirs(az, el)


    def _spin_shots(self, frame_index: int, period: float, seed: int):
        cols = self._spin_columns()
        el = np.asarray(self.beam_elevations_deg, np.float64)
        jitter = np.random.default_rng([int(seed), int(frame_index), 11]).uniform(0.0, 1.0)
        az_col = -self.fov_h_deg / 2 + (np.arange(cols) + jitter) * self.az_step_deg
        # one rotation per period: a column at azimuth a fires (a + fov/2) / 360 of a period in
        t_col = (az_col + self.fov_h_deg / 2) / 360.0 * period
        az = np.repeat(az_col, len(el))
        rel_t = np.repeat(t_col, len(el))
        line = np.tile(np.arange(len(el)), cols).astype(np.uint8)
        return rel_t, line, angles_to_dirs(az, np.tile(el, cols))


def angles_to_dirs(az_deg: np.ndarray, el_deg: np.ndarray) -> np.ndarray:
    az = np.radians(az_deg)
    el = np.radians(el_deg)
    ce = np.cos(el)
    return np.stack([ce * np.cos(az), ce * np.sin(az), np.sin(el)], axis=-1)


def dirs_to_angles(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Azimuth and elevation (deg) of vectors (N,3) (need not be unit length)."""
    xyz = np.asarray(xyz, dtype=np.float64)
    az = np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))
    el = np.degrees(np.arctan2(xyz[:, 2], np.hypot(xyz[:, 0], xyz[:, 1])))
    return az, el


def _six_line_offsets(az_spread: float, el_step: float) -> tuple[tuple[float, float], ...]:
    # Interleaved firing order of the six lasers is not monotonic in elevation (as measured on a Horizon).
    el_rank = (2.5, -1.5, 0.5, -0.5, 1.5, -2.5)
    az_rank = (0.6, -0.2, 0.3, -0.6, 1.0, -1.0)
    return tuple((az_spread * a, el_step * e) for a, e in zip(az_rank, el_rank))


SENSORS: dict[str, SensorModel] = {
    "mid40": SensorModel(
        name="mid40", point_rate=100_000, n_lines=1, fov_shape="circle", fov_h_deg=38.4, fov_v_deg=38.4,
        pattern="rosette", range_min=1.0, range_at_10pct=90.0, range_at_80pct=260.0,
        prism_hz=(7294 / 60, -4664 / 60), half_axes_deg=(19.1, 19.1), beam_divergence_deg=0.28,
    ),
    "mid70": SensorModel(
        name="mid70", point_rate=100_000, n_lines=1, fov_shape="circle", fov_h_deg=70.4, fov_v_deg=70.4,
        pattern="rosette", range_min=0.05, range_at_10pct=90.0, range_at_80pct=260.0,
        prism_hz=(7243 / 60, -4631 / 60), half_axes_deg=(35.1, 35.1), beam_divergence_deg=0.28,
    ),
    "tele15": SensorModel(
        name="tele15", point_rate=240_000, n_lines=1, fov_shape="rect", fov_h_deg=14.5, fov_v_deg=16.2,
        pattern="rosette", range_min=1.0, range_at_10pct=320.0, range_at_80pct=500.0,
        prism_hz=(213.7, -190.9), half_axes_deg=(7.2, 8.05), beam_divergence_deg=0.12,
    ),
    "horizon": SensorModel(
        name="horizon", point_rate=240_000, n_lines=6, fov_shape="rect", fov_h_deg=81.7, fov_v_deg=25.1,
        pattern="horizon", range_min=0.5, range_at_10pct=90.0, range_at_80pct=260.0,
        line_offsets_deg=_six_line_offsets(2.2, 0.95), sweep_hz=71.3, sweep_half_deg=39.0,
        sweep_center_deg=0.0, step_half_deg=4.7, drift_hz=4.93, drift_half_deg=5.4,
        beam_divergence_deg=0.28,
    ),
    "avia": SensorModel(
        name="avia", point_rate=240_000, n_lines=6, fov_shape="rect", fov_h_deg=70.4, fov_v_deg=77.2,
        pattern="rosette", range_min=1.0, range_at_10pct=190.0, range_at_80pct=450.0,
        prism_hz=(8157 / 60, -5219 / 60), half_axes_deg=(33.4, 33.4),
        line_offsets_deg=_six_line_offsets(1.4, 1.9), beam_divergence_deg=0.28,
    ),
}


def _vlp32c_elevations() -> tuple[float, ...]:
    # VLP-32C: dense around the horizon (0.33 deg), sparse towards -25 / +15 deg
    return (-25.0, -15.639, -11.31, -8.843, -7.254, -6.148, -5.333, -4.667, -4.0, -3.667, -3.333, -3.0,
            -2.667, -2.333, -2.0, -1.667, -1.333, -1.0, -0.667, -0.333, 0.0, 0.333, 0.667, 1.0, 1.333, 1.667,
            2.333, 3.333, 4.667, 7.0, 10.333, 15.0)


# Spinning multi-beam LiDARs, forward +-45 deg cone only: training proxies (not Livox; no presets).
PROXY_SENSORS: dict[str, SensorModel] = {
    "hdl64": SensorModel(
        name="hdl64", point_rate=0.0, n_lines=64, fov_shape="rect", fov_h_deg=90.0, fov_v_deg=26.9,
        pattern="spin", range_min=1.0, range_at_10pct=80.0, range_at_80pct=120.0, range_noise=0.02,
        beam_elevations_deg=tuple(np.r_[np.linspace(2.0, -8.33, 32), np.linspace(-8.83, -24.9, 32)].round(3)),
        az_step_deg=0.17, beam_divergence_deg=0.12,
    ),
    "vlp32": SensorModel(
        name="vlp32", point_rate=0.0, n_lines=32, fov_shape="rect", fov_h_deg=90.0, fov_v_deg=40.0,
        pattern="spin", range_min=1.0, range_at_10pct=100.0, range_at_80pct=200.0, range_noise=0.03,
        beam_elevations_deg=_vlp32c_elevations(), az_step_deg=0.2, beam_divergence_deg=0.18,
    ),
    "os64": SensorModel(
        name="os64", point_rate=0.0, n_lines=64, fov_shape="rect", fov_h_deg=90.0, fov_v_deg=45.0,
        pattern="spin", range_min=0.5, range_at_10pct=80.0, range_at_80pct=140.0, range_noise=0.03,
        beam_elevations_deg=tuple(np.linspace(22.5, -22.5, 64).round(3)), az_step_deg=0.35,
        beam_divergence_deg=0.2,
    ),
}


RANDOM_SPIN = "spinrand"
SPIN_BEAMS = (16, 32, 40, 64, 128)
SPIN_LAYOUTS = ("uniform", "horizon_band", "two_blocks")
MAX_SPIN_RAYS = 60_000  # a 128-beam draw widens its column step to stay within this many rays per frame


def _spin_elevations(rng: np.random.Generator, n: int, layout: str) -> np.ndarray:
    """``n`` beam elevations (deg, top first) of one ``layout``."""
    top = rng.uniform(2.0, 15.0)
    bottom = -rng.uniform(15.0, 25.0)
    if layout == "uniform":  # VLP-16, OS1-64/128
        el = np.linspace(top, bottom, n)
    elif layout == "horizon_band":  # VLP-32C, Pandar40: fine spacing in a band around the horizon
        n_band = int(round(n * rng.uniform(0.45, 0.7)))
        band_top = rng.uniform(1.0, 3.0)
        band_bottom = rng.uniform(-8.0, -4.0)  # Pandar40: -6..+2 deg at 0.33, VLP-32C: -4.7..+1.7
        n_up = max(1, (n - n_band) // 3)
        n_down = n - n_band - n_up
        top = max(top, band_top + 0.8 * n_up)  # the rows above the band stay sparse, as below it
        # sparse rows widen away from the band (VLP-32C: 0.33 deg near 0, 4.7 deg at the top)
        up = band_top + (top - band_top) * (np.arange(n_up, 0, -1) / n_up) ** 1.5
        band = np.linspace(band_top, band_bottom, n_band)
        down = band_bottom - (band_bottom - bottom) * (np.arange(1, n_down + 1) / n_down) ** 1.5
        el = np.r_[up, band, down]
    elif layout == "two_blocks":  # HDL-64E: a denser upper block and a sparser lower one
        mid = rng.uniform(-10.0, -6.0)
        upper = np.linspace(min(top, 4.0), mid, n // 2)
        lower = np.linspace(mid - 0.5, bottom, n - n // 2)
        el = np.r_[upper, lower]
    else:  # pragma: no cover - SPIN_LAYOUTS
        raise ConfigError(f"unknown beam layout {layout!r}")
    el = el + rng.normal(0.0, 0.02, n)  # mounting tolerance of each laser
    return np.sort(el)[::-1]


def random_spin_sensor(seed: int) -> SensorModel:
    """The ``spinrand`` sensor of one seed: a spinning multi-beam LiDAR drawn at random (forward +-45 deg cone)."""
    rng = np.random.default_rng([int(seed), 8111])
    n = int(rng.choice(SPIN_BEAMS))
    layout = str(rng.choice(SPIN_LAYOUTS))
    el = _spin_elevations(rng, n, layout)
    fov_h = 90.0
    az_step = max(float(rng.uniform(0.1, 0.4)), fov_h * n / MAX_SPIN_RAYS)
    r10 = float(rng.uniform(60.0, 120.0))
    return SensorModel(
        name=RANDOM_SPIN, point_rate=0.0, n_lines=n, fov_shape="rect", fov_h_deg=fov_h,
        fov_v_deg=float(el[0] - el[-1]), pattern="spin", range_min=float(rng.uniform(0.5, 1.5)),
        range_at_10pct=r10, range_at_80pct=r10 * float(rng.uniform(1.4, 2.0)),
        range_noise=float(rng.uniform(0.015, 0.04)), beam_elevations_deg=tuple(np.round(el, 3)),
        az_step_deg=round(az_step, 4), beam_divergence_deg=float(rng.uniform(0.1, 0.25)),
        extra={"layout": layout},
    )


def get_sensor(name: str | SensorModel, seed: int = 0) -> SensorModel:
    """A Livox model from SENSORS, a spinning training proxy from PROXY_SENSORS, or ``spinrand``: the random
    spinning LiDAR of ``seed`` (random_spin_sensor)."""
    if isinstance(name, SensorModel):
        return name
    key = str(name).lower().replace("-", "").replace("_", "")
    if key in SENSORS:
        return SENSORS[key]
    if key in PROXY_SENSORS:
        return PROXY_SENSORS[key]
    if key == RANDOM_SPIN:
        return random_spin_sensor(seed)
    raise ConfigError(f"unknown sensor {name!r}; choose one of "
                      f"{sorted(SENSORS) + sorted(PROXY_SENSORS) + [RANDOM_SPIN]}")
