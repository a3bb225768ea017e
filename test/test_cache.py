"""The one cache folder (livox_infer/cache.py), a second start that reuses the compiled network, and the choice of
the AOTInductor package built for this machine (livox_infer.detector.aoti.find_package) with the reason when none
fits, including the grid-vs-architecture wording of a refused package (issue 30: the Avia preset's grid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from conftest import tiny_model_dict
from livox_infer.detector import ModelConfig
from livox_infer.detector.aoti import (
    MATCH_FIELDS, PACKAGE_FORMAT, _check_metadata, find_package, package_fields, package_name,
)
from livox_infer.errors import WeightsError

REPO = Path(__file__).resolve().parent.parent
AVIA_GRID = (0.0, 80.0, -41.6, 41.6)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(LIVOX_INFER_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               LIVOX_INFER_AOTI_MANIFEST=str(tmp_path / "manifest.json"), **extra)
    return env


def test_inductor_uses_the_one_cache_folder_even_after_torch_set_its_default(tmp_path):
    """Importing inductor (the voxelizer does) writes torch's /tmp default into TORCHINDUCTOR_CACHE_DIR; the old
    setdefault then kept it, so the node, the docs and the Makefile each named another folder."""
    code = textwrap.dedent("""
        import os
        import livox_infer.voxelize  # imports torch._inductor
        from livox_infer.cache import inductor_cache_dir, packages_dir
        print(os.environ["TORCHINDUCTOR_CACHE_DIR"]); print(inductor_cache_dir()); print(packages_dir())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    env_dir, cache_dir, packages = out.stdout.split()
    assert env_dir == cache_dir == str(tmp_path / "cache" / "inductor")
    assert packages == str(tmp_path / "cache" / "packages")
    # a folder the user chose wins
    mine = tmp_path / "mine"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(mine)))
    assert out.stdout.split()[:2] == [str(mine)] * 2


def test_no_other_folder_is_named(tmp_path):
    """The cache folder is stated once: the Makefile and the GPU script no longer point torch elsewhere."""
    for name in ("Makefile", "scripts/device_check.sh"):
        text = (REPO / name).read_text()
        assert "TORCHINDUCTOR_CACHE_DIR" not in text and ".cache/torchinductor" not in text, name


@pytest.mark.slow  # two processes that compile a tiny network: ~30-60 s on a loaded 2-core machine
def test_second_start_reuses_the_compiled_network(tmp_path):
    """Two starts in a row on one machine: the second loads the compiled network the first saved, without tracing
    (livox_infer.detector.precompiled; no 'bypassed' line). Before the first fix every start said 'inductor graph cache
    bypassed' (frozen weights pre-packed as mkldnn tensors); before the second, a warm start still traced (~10 s)."""
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_model_dict()))
    from livox_infer.detector import build_model, save_weights

    cfg = ModelConfig.load(cfg_path)
    torch.manual_seed(0)
    save_weights(build_model(cfg), cfg, tmp_path / "tiny.safetensors")
    code = textwrap.dedent(f"""
        from livox_infer.pipeline import DetectionPipeline
        pipe = DetectionPipeline({str(cfg_path)!r}, device="cpu", compile=True)
        print("BACKEND", pipe.network_backend)
        print("SUMMARY", pipe.startup.summary())
    """)
    summaries = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path),
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "BACKEND compiled" in out.stdout, out.stdout
        summaries.append(next(line for line in out.stdout.splitlines() if line.startswith("SUMMARY")))
    assert "network compiled and saved (the saved one: none saved)" in summaries[0], summaries
    assert "network loaded" in summaries[1] and "bypassed" not in summaries[1], summaries
    # and the one note says why no package ran
    assert "torch.compile, since no AOTInductor package for model" in summaries[1]
    assert any((tmp_path / "cache" / "inductor").iterdir()) and any((tmp_path / "cache" / "precompiled").iterdir())


# --------------------------------------------------------------------------- package choice (no compile)
def _lite():
    return ModelConfig.load("lite")


def _install_sidecar(folder: Path, fields: dict[str, str]) -> Path:
    """What `export --install` leaves: the package (here a placeholder) and its match fields beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    pkg = folder / package_name(fields)
    pkg.write_bytes(b"placeholder")
    pkg.with_suffix(".json").write_text(json.dumps(fields))
    return pkg


def test_find_package_picks_the_exact_match_and_says_why_not_otherwise(tmp_path):
    cpu = torch.device("cpu")
    cfg = _lite()
    here = package_fields(cfg, cfg.weights_path(), cpu, False)
    assert set(here) == set(MATCH_FIELDS) and here["format"] == PACKAGE_FORMAT
    folder = tmp_path / "packages"
    path, why = find_package(here, folder)
    assert path is None and "no AOTInductor package for model lite" in why and "make package" in why
    # a package for the Avia grid does not serve the model grid: the grid is named, not "architecture"
    avia = package_fields(cfg.with_extent(AVIA_GRID), cfg.weights_path(), cpu, False)
    _install_sidecar(folder, avia)
    path, why = find_package(here, folder)
    assert path is None and "differs in grid (bev_extent): 0,80,-41.6,41.6 there, 0,80,-28.8,28.8 here" in why
    assert find_package(avia, folder)[0] == folder / package_name(avia)
    # same grid, other torch / threads / weights: each named
    for key, value, words in (("torch_version", "2.0.0", "torch version"), ("threads", "4", "threads"),
                              ("weights_sha256", "0" * 64, "weights (sha256)"), ("machine", "aarch64 NEON", "CPU")):
        sub = tmp_path / key
        _install_sidecar(sub, {**here, key: value})
        path, why = find_package(here, sub)
        assert path is None and f"differs in {words}: {value} there" in why, why


def test_a_refused_package_names_the_real_cause(tmp_path):
    """Issue 30: a model-grid package run with the Avia preset was refused as 'another architecture'."""
    cpu = torch.device("cpu")
    cfg = _lite()
    meta = dict(package_fields(cfg, cfg.weights_path(), cpu, False))
    with pytest.raises(WeightsError) as err:
        _check_metadata(meta, Path("lite.cpu.pt2"), cfg.with_extent(AVIA_GRID), cpu, False)
    msg = str(err.value)
    assert "grid bev_extent [0,80,-28.8,28.8]" in msg and "[0,80,-41.6,41.6]" in msg
    assert "--sensor" in msg and "another architecture" not in msg
    # a really different network is still "another architecture"
    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump(tiny_model_dict(6)))
    other = ModelConfig.load(other_path)
    with pytest.raises(WeightsError, match="another architecture than"):
        _check_metadata(meta, Path("lite.cpu.pt2"), other, cpu, False)
    # an older package without a recorded grid: both causes named
    old = {k: v for k, v in meta.items() if k != "bev_extent"}
    with pytest.raises(WeightsError, match="another architecture or detection grid"):
        _check_metadata(old, Path("lite.cpu.pt2"), cfg.with_extent(AVIA_GRID), cpu, False)
    assert _check_metadata(meta, Path("lite.cpu.pt2"), cfg, cpu, False) is None


def test_export_takes_the_sensor_presets_grid():
    from livox_infer.tools.cli import build_parser
    from livox_infer.tools.export import export_config

    def cfg_of(*argv):
        argv = ["export", *argv]
        return export_config(build_parser(argv).parse_args(argv))

    assert cfg_of().grid.x_range == (0.0, 80.0)
    avia = cfg_of("--sensor", "avia")
    assert (avia.grid.x_range, avia.grid.y_range) == ((0.0, 80.0), (-41.6, 41.6))
    assert cfg_of("--sensor", "tele15").grid.x_range == (0.0, 153.6)
    explicit = cfg_of("--sensor", "avia", "--bev-extent", "0", "51.2", "-25.6", "25.6")
    assert explicit.grid.x_range == (0.0, 51.2)
    assert avia.architecture_hash() == ModelConfig.load("lite").with_extent(AVIA_GRID).architecture_hash()
