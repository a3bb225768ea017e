"""Realism comparison script against the real Horizon scans (shared data)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SHARED_DATA
from livox_infer.sim import compare

REAL = SHARED_DATA / "livox_horizon"


@pytest.mark.skipif(not REAL.is_dir(), reason="shared real Horizon scans not available")
@pytest.mark.slow  # simulates and compares with the real scans: ~13 s
def test_compare_runs_and_sim_matches_real_basics(tmp_path, capsys):
    real = compare.load_real(REAL)
    assert len(real) == 2
    # ~0.2 s: one full cycle of the Horizon's slow elevation drift, like the real files
    sim = compare.simulate_like_real(40000, seed=0, scene="open", height=0.85)
    assert len(sim) == 40000 and np.isfinite(sim).all()
    s_real = compare.stats(next(iter(real.values())))
    s_sim = compare.stats(sim)
    # the simulated mount and the real ground level are found the same way
    assert s_sim["height"] == pytest.approx(0.85, abs=0.05)
    assert 0.6 < s_real["height"] < 1.0
    # reflectivity medians within a factor of 2, both scans see ground and sky-side content
    assert 0.5 < s_sim["refl_pct"][2] / s_real["refl_pct"][2] < 2.0
    assert 0.2 < s_sim["ground_frac"] < 0.8 and 0.2 < s_sim["above_horizon_frac"] < 0.7
    assert compare.main(["--data", str(REAL), "--out", str(tmp_path), "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "reflectivity p50" in out and "real:livox_source" in out
    for name in ("sim_vs_real_bev.png", "sim_vs_real_rangeimage.png", "sim_vs_real_hist.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_compare_reports_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError):
        compare.load_real(tmp_path)
