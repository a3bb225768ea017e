"""Realism check: simulated Horizon frames against the real Livox Horizon scans in shared/data.

    python -m livox_infer.sim.compare [--data DIR] [--out docs/img] [--seeds 4]

Prints a table (point count, density vs range, ground height spread, reflectivity percentiles,
elevation coverage) and writes side-by-side pictures (BEV, azimuth-elevation image, histograms).
The real files are short accumulations (~40k points); the simulation accumulates the same number of
shots (consecutive frames of one continuous scan) at the real mount height (0.9 m, level).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

RANGE_BINS = np.array([0, 5, 10, 20, 30, 50, 80, 120, 1000.0])
REFL_BINS = np.array([0, 5, 10, 20, 30, 50, 80, 100, 150, 256.0])


def default_data_dir() -> Path:
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "livox_horizon"


def load_real(data_dir: Path) -> dict[str, np.ndarray]:
    from livox_infer.decode.pointfiles import read_pcd

    files = sorted(data_dir.glob("*.pcd"))
    if not files:
        raise FileNotFoundError(f"no .pcd files in {data_dir}")
    out = {}
    for f in files:
        p = np.asarray(read_pcd(f), dtype=np.float32)
        p = p[np.any(p[:, :3] != 0, axis=1)]
        out[f.stem] = p
    return out


def simulate_like_real(n_points: int, seed: int, scene: str, height: float = 0.9) -> np.ndarray:
    """Consecutive Horizon frames of one scan until about ``n_points`` returns are collected."""
    from livox_infer.sim import make_scene, simulate_frame

    scn = make_scene(seed, scene, moving=False)
    chunks, total, k = [], 0, 0
    while total < n_points and k < 20:
        f = simulate_frame("horizon", seed=seed, frame_index=k, scene=scn, sensor_height=height, pitch_deg=0.0,
                           roll_deg=0.0, yaw_deg=0.0)
        p = f.points[f.valid & (f.tag == 0)]
        chunks.append(p)
        total += len(p)
        k += 1
    return np.concatenate(chunks)[:n_points]


def ground_mask(p: np.ndarray, height: float) -> np.ndarray:
    # a robust ground pick that works on both: low points within 0.35 m of the expected level
    return np.abs(p[:, 2] + height) < 0.35


def estimate_height(p: np.ndarray) -> float:
    """Ground level of a scan: the mode of z among the lowest points near the sensor."""
    r = np.hypot(p[:, 0], p[:, 1])
    z = p[(r > 3) & (r < 12), 2]
    hist, edges = np.histogram(z, bins=np.arange(-3, 0.5, 0.02))
    return float(-(edges[np.argmax(hist)] + 0.01))


def stats(p: np.ndarray) -> dict[str, np.ndarray | float]:
    r = np.linalg.norm(p[:, :3], axis=1)
    h = estimate_height(p)
    g = ground_mask(p, h) & (np.hypot(p[:, 0], p[:, 1]) > 4) & (np.hypot(p[:, 0], p[:, 1]) < 15)
    el = np.degrees(np.arcsin(p[:, 2] / np.maximum(r, 1e-6)))
    gz = p[g, 2]
    r_ground = np.hypot(p[ground_mask(p, h), 0], p[ground_mask(p, h), 1])
    return {
        "n": float(len(p)),
        "height": h,
        "range_frac": np.histogram(r, RANGE_BINS)[0] / len(p),
        "ground_frac": float(ground_mask(p, h).mean()),
        "ground_iqr_cm": float(np.subtract(*np.percentile(gz, [75, 25])) * 100) if len(gz) else np.nan,
        "ground_p95_range": float(np.percentile(r_ground, 95)) if len(r_ground) else np.nan,
        "refl_pct": np.percentile(p[:, 3], [10, 25, 50, 75, 90, 99]),
        "refl_hist": np.histogram(p[:, 3], REFL_BINS)[0] / len(p),
        "above_horizon_frac": float((el > 0).mean()),
        "median_range": float(np.median(r)),
    }


def print_table(rows: dict[str, dict]) -> None:
    names = list(rows)
    w = max(12, max(len(n) for n in names) + 2)
    print("metric".ljust(26) + "".join(n.rjust(w) for n in names))

    def line(label, fn):
        print(label.ljust(26) + "".join(fn(rows[n]).rjust(w) for n in names))

    line("points", lambda s: f"{s['n']:.0f}")
    line("ground level (m)", lambda s: f"{-s['height']:.2f}")
    line("median range (m)", lambda s: f"{s['median_range']:.1f}")
    for i in range(len(RANGE_BINS) - 1):
        line(f"range {RANGE_BINS[i]:.0f}-{RANGE_BINS[i + 1]:.0f} m", lambda s, i=i: f"{100 * s['range_frac'][i]:.1f}%")
    line("ground points", lambda s: f"{100 * s['ground_frac']:.1f}%")
    line("ground z IQR 4-15 m (cm)", lambda s: f"{s['ground_iqr_cm']:.1f}")
    line("ground p95 range (m)", lambda s: f"{s['ground_p95_range']:.1f}")
    line("above horizon", lambda s: f"{100 * s['above_horizon_frac']:.1f}%")
    for q, j in zip((10, 25, 50, 75, 90, 99), range(6)):
        line(f"reflectivity p{q}", lambda s, j=j: f"{s['refl_pct'][j]:.0f}")


def plot(real: dict[str, np.ndarray], sims: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    clouds = {**{f"real {k}": v for k, v in real.items()}, **{f"sim {k}": v for k, v in sims.items()}}
    n = len(clouds)
    paths = []
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 6.5))
    for ax, (name, p) in zip(np.atleast_1d(axes), clouds.items()):
        h = estimate_height(p)
        ax.scatter(p[:, 0], p[:, 1], s=0.15, c=p[:, 2] + h, cmap="jet", vmin=0, vmax=4, rasterized=True)
        ax.set_xlim(0, 70)
        ax.set_ylim(-35, 35)
        ax.set_aspect("equal")
        ax.set_title(f"{name}: BEV, colour = height above ground 0-4 m")
    fig.tight_layout()
    paths.append(out_dir / "sim_vs_real_bev.png")
    fig.savefig(paths[-1], dpi=70)
    plt.close(fig)

    fig, axes = plt.subplots(n, 1, figsize=(13, 2.6 * n))
    for ax, (name, p) in zip(np.atleast_1d(axes), clouds.items()):
        r = np.linalg.norm(p[:, :3], axis=1)
        az = np.degrees(np.arctan2(p[:, 1], p[:, 0]))
        el = np.degrees(np.arcsin(p[:, 2] / r))
        ax.scatter(-az, el, s=0.2, c=np.minimum(r, 60), cmap="jet", vmin=0, vmax=60, rasterized=True)
        ax.set_xlim(-65, 65)
        ax.set_ylim(-16, 16)
        ax.set_title(f"{name}: azimuth-elevation (deg, left = +y), colour = range 0-60 m", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "sim_vs_real_rangeimage.png")
    fig.savefig(paths[-1], dpi=70)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for name, p in clouds.items():
        r = np.linalg.norm(p[:, :3], axis=1)
        style = "-" if name.startswith("real") else "--"
        axes[0].hist(r, bins=np.arange(0, 120, 2), histtype="step", density=True, ls=style, label=name)
        h = estimate_height(p)
        axes[1].hist(p[:, 2] + h, bins=np.arange(-0.5, 4, 0.05), histtype="step", density=True, ls=style, label=name)
        axes[2].hist(p[:, 3], bins=np.arange(0, 256, 3), histtype="step", density=True, ls=style, label=name)
    axes[0].set_title("density vs range (m)")
    axes[1].set_title("height above estimated ground (m)")
    axes[2].set_title("reflectivity")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "sim_vs_real_hist.png")
    fig.savefig(paths[-1], dpi=70)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m livox_infer.sim.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--seeds", type=int, default=2, help="simulated scans per scene mode")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    real = load_real(args.data)
    n_ref = int(np.mean([len(p) for p in real.values()]))
    height = float(np.mean([estimate_height(p) for p in real.values()]))
    sims = {}
    for mode in ("street", "open"):
        for seed in range(args.seeds):
            sims[f"{mode}{seed}"] = simulate_like_real(n_ref, seed, mode, height)
    rows = {f"real:{k}": stats(v) for k, v in real.items()}
    rows.update({f"sim:{k}": stats(v) for k, v in sims.items()})
    print_table(rows)
    if not args.no_plots:
        # one of each for the pictures
        pick = {k: v for k, v in sims.items() if k.endswith("0")}
        for path in plot(real, pick, args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
