"""`livox-infer export` (AOTInductor package) and the pipeline running it: same outputs as eager, checked metadata.

One package of a tiny config is compiled for the module (~20-40 s of C++ compilation on CPU)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from livox_infer.tools.cli import main as cli_main
from livox_infer.errors import WeightsError
from livox_infer.detector import ModelConfig, build_model, save_weights
from conftest import tiny_model_dict
from livox_infer.detector.aoti import MANIFEST_ENV, PACKAGE_FORMAT, AotiRunner, read_manifest, record_in_manifest
from livox_infer.detector.postprocess import build_inference_model
from livox_infer.pipeline import DetectionPipeline


# slow: AOTInductor compile of a tiny network (module fixture): ~30 s
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="AOTInductor export needs a C++ compiler")]


def _tiny_config(channels=4):
    d = tiny_model_dict(channels)
    d["head"]["top_k"] = 16
    d["score_thresholds"] = 0.0
    return d


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as mp:  # the trusted-package manifest of this module, not the user's
        mp.setenv(MANIFEST_ENV, str(root / "aoti_manifest.json"))
        yield _export(root)


def _export(root):
    cfg_path = root / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(_tiny_config()))
    cfg = ModelConfig.load(cfg_path)
    torch.manual_seed(0)
    net = build_model(cfg)
    with torch.no_grad():  # non-trivial BatchNorm statistics, so folding them is exercised
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    save_weights(net, cfg, root / "tiny.safetensors", extra={"trained": "no"})
    out = root / "tiny.cpu.pt2"
    # fp32: the comparisons below are to 1e-5 (bf16, the default on a CPU with AMX: test_precision.py)
    rc = cli_main(["export", "--config", str(cfg_path), "--out", str(out), "--check", "--precision", "fp32"])
    assert rc == 0 and out.is_file()
    return cfg_path, root / "tiny.safetensors", out


def test_package_matches_eager(package, capsys):
    cfg_path, weights, pkg = package
    cfg = ModelConfig.load(cfg_path)
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    assert runner.metadata["architecture_hash"] == cfg.architecture_hash()
    infer, _ = build_inference_model(cfg, weights, torch.device("cpu"))
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.rand(1, *cfg.grid.shape).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            (s0, l0, b0), (s1, l1, b1) = infer(x), runner(x)
        assert torch.allclose(s0, s1, atol=1e-5) and torch.equal(l0, l1) and torch.allclose(b0, b1, atol=1e-4)


def test_pipeline_with_package_gives_the_eager_detections(package):
    cfg_path, weights, pkg = package
    rng = np.random.default_rng(0)
    cloud = np.c_[rng.uniform(0, 25, (3000, 2)) * [1, 1] - [0, 12], rng.uniform(-1.5, 1.0, 3000),
                  rng.uniform(0, 255, 3000)].astype(np.float32)
    eager = DetectionPipeline(cfg_path, weights=weights, compile=False, sensor_height=1.5, device="cpu",
                              precision="fp32")
    aoti = DetectionPipeline(cfg_path, aoti_package=pkg, sensor_height=1.5, device="cpu")
    assert aoti.network_backend == "aoti" and eager.network_backend == "eager"
    assert aoti.precision == "fp32"  # "auto" takes the package's own
    assert aoti.weights_meta["trained"] == "no"
    a, b = eager.detect(cloud), aoti.detect(cloud)
    assert len(a) > 0 and len(a) == len(b)
    assert np.allclose(a.boxes, b.boxes, atol=1e-4) and np.allclose(a.scores, b.scores, atol=1e-5)
    # the exporting weights file may be named too; another file is refused
    DetectionPipeline(cfg_path, weights=weights, aoti_package=pkg, sensor_height=1.5, device="cpu")
    other = weights.with_name("other.safetensors")
    torch.manual_seed(5)
    save_weights(build_model(ModelConfig.load(cfg_path)), ModelConfig.load(cfg_path), other)
    with pytest.raises(WeightsError, match="not exported from"):
        DetectionPipeline(cfg_path, weights=other, aoti_package=pkg, sensor_height=1.5, device="cpu")
    # switching at run time goes back to the plain network
    aoti.update(aoti_package=None, compile=False, precision="fp32")
    assert aoti.network_backend == "eager" and len(aoti.detect(cloud)) == len(a)


def test_a_cpu_package_holds_stage_2s_costly_parts(package):
    """Stage 2's point features (dynamic point and box counts) and refiner are compiled into the package beside the
    network and give the eager parts' values; a call the package was not compiled for (another intensity scale, a
    single box) runs the eager function instead."""
    from livox_infer.detector.aoti import STAGE2_PARTS, PackageStage2
    from livox_infer.detector.refine import POINT_FEATURES, context_size, sampled_features

    cfg_path, weights, pkg = package
    cfg = ModelConfig.load(cfg_path)
    rc = cfg.refine
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    assert runner.metadata["stage2"] == STAGE2_PARTS and isinstance(runner.stage2, PackageStage2)
    net = build_model(cfg)
    from livox_infer.detector.weights import load_weights

    load_weights(net, cfg, weights)
    net.eval()
    calls = []
    compiled_features = runner.stage2._features
    runner.stage2._features = lambda *a: calls.append(len(a[0])) or compiled_features(*a)
    torch.manual_seed(2)
    for n, r in ((300, rc.rois), (5000, 7), (64, 2)):
        points = torch.rand(n, 4) * torch.tensor([20.0, 20.0, 3.0, 255.0]) - torch.tensor([0.0, 10.0, 1.0, 0.0])
        boxes = torch.cat([torch.rand(r, 2) * 15, torch.zeros(r, 1), torch.full((r, 3), 4.0), torch.rand(r, 1)], 1)
        args = (points, torch.arange(n) * 3, boxes, rc.points, rc.margin, cfg.grid.intensity_scale)
        (fa, va), (fb, vb) = runner.stage2.features(*args), sampled_features(*args)
        assert torch.equal(va, vb)  # the same points sampled
        torch.testing.assert_close(fa, fb, rtol=1e-5, atol=1e-5)  # (inductor fuses the divisions differently)
    assert calls == [300, 5000, 64]
    one_box = (points, torch.arange(64), boxes[:1], rc.points, rc.margin, cfg.grid.intensity_scale)
    other_scale = (points, torch.arange(64), boxes, rc.points, rc.margin, 100.0)
    for args in (one_box, other_scale):
        for a, b in zip(runner.stage2.features(*args), sampled_features(*args)):
            assert torch.equal(a, b)
    assert calls == [300, 5000, 64]  # those two ran eagerly
    refiner_args = (torch.randn(rc.rois, rc.points, POINT_FEATURES), torch.rand(rc.rois, rc.points) > 0.3,
                    torch.randn(rc.rois, context_size(cfg.num_classes, rc.visibility_size)))
    with torch.no_grad():
        for a, b in zip(runner.stage2.refiner(*refiner_args), net.refiner(*refiner_args)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    pipe = DetectionPipeline(cfg_path, aoti_package=pkg, sensor_height=1.5, device="cpu")
    stage2 = pipe._stage2.compiled_refiner
    assert isinstance(stage2, PackageStage2) and stage2.eager_refiner is pipe._stage2.refiner
    # a compiled part that fails runs eagerly from then on, with one warning, instead of failing every frame
    def broken(*a):
        raise RuntimeError("shape check failed")

    stage2._features = stage2._refiner = broken
    stage2._pass = None  # as a format-v2 package: each pass from its parts
    rng = np.random.default_rng(3)
    cloud = np.c_[rng.uniform(0, 25, (3000, 2)) - [0, 12], rng.uniform(-1.5, 1.0, 3000),
                  rng.uniform(0, 255, 3000)].astype(np.float32)
    eager = DetectionPipeline(cfg_path, weights=weights, compile=False, sensor_height=1.5, device="cpu", precision="fp32")
    a, b = eager.detect(cloud), pipe.detect(cloud)
    assert stage2._features is None
    assert len(a) == len(b) and np.allclose(a.scores, b.scores, atol=1e-5)
    assert stage2._refiner is None  # (fewer candidates than rois are filled up: the broken refiner ran, and failed)
    with torch.no_grad():
        for x, y in zip(stage2.refiner(*refiner_args), net.refiner(*refiner_args)):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def _cloud_and_candidates(rc, r: int, seed: int, height: float, size: tuple[float, float]):
    """A 4000-point cloud (30 m x 30 m x ``height``) and ``r`` candidate boxes in it, sizes from ``size`` = (least,
    spread) metres, of the classes ``rc`` refines, scores falling: (points, scores, labels, boxes)."""
    torch.manual_seed(seed)
    points = torch.rand(4000, 4) * torch.tensor([30.0, 30.0, height, 255.0]) - torch.tensor([0.0, 15.0, 1.0, 0.0])
    boxes = torch.cat([torch.rand(r, 2) * 25 + torch.tensor([0.0, -12.0]), torch.zeros(r, 1),
                       torch.rand(r, 3) * size[1] + size[0], torch.rand(r, 1) * 3], 1)
    refined = torch.nonzero(torch.tensor(rc.refined))[:, 0]
    scores, labels = torch.rand(r).sort(descending=True).values, refined[torch.randint(0, len(refined), (r,))]
    return points, scores, labels, boxes


def test_a_cpu_package_runs_a_whole_refinement_pass_compiled(package):
    """Format v3: a frame with ``rois`` candidates runs each refinement pass as one compiled call (`RefinePass`)
    with the values of the pass run from its parts; fewer candidates, another intensity scale or a failing part run
    the parts."""
    from livox_infer.detector.refine import refine_candidates
    from livox_infer.detector.weights import load_weights

    cfg_path, weights, pkg = package
    cfg = ModelConfig.load(cfg_path)
    rc = cfg.refine
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    stage2 = runner.stage2
    assert runner.metadata["format"] == PACKAGE_FORMAT and stage2._pass is not None
    net = build_model(cfg)
    load_weights(net, cfg, weights)
    net.eval()
    stage2.eager_refiner = net.refiner
    calls = []
    compiled_pass = stage2._pass
    stage2._pass = lambda *a: calls.append(len(a[0])) or compiled_pass(*a)
    r = rc.rois + 3
    points, scores, labels, boxes = _cloud_and_candidates(rc, r, seed=5, height=3.0, size=(1.0, 3.0))
    scale = cfg.grid.intensity_scale
    want = refine_candidates(net.refiner, rc, cfg.num_classes, points, scores, labels, boxes, scale)
    got = refine_candidates(net.refiner, rc, cfg.num_classes, points, scores, labels, boxes, scale, compiled=stage2)
    assert len(calls) == rc.passes
    assert torch.equal(got[1], want[1])
    for a, b in ((got[0], want[0]), (got[2], want[2])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # fewer candidates than rois: filled up to rois for the compiled pass, the same values for the real ones
    few = refine_candidates(net.refiner, rc, cfg.num_classes, points, scores[:5], labels[:5], boxes[:5], scale,
                            compiled=stage2)
    assert len(calls) == 2 * rc.passes and calls[-1] > 0 and len(few[0]) == 5
    alone = refine_candidates(net.refiner, rc, cfg.num_classes, points, scores[:5], labels[:5], boxes[:5], scale)
    assert torch.equal(few[1], alone[1])
    for a, b in ((few[0], alone[0]), (few[2], alone[2])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # another intensity scale: from the parts
    refine_candidates(net.refiner, rc, cfg.num_classes, points, scores, labels, boxes, scale / 2, compiled=stage2)
    assert len(calls) == 2 * rc.passes

    def broken(*a):
        raise RuntimeError("shape check failed")

    stage2._pass = broken
    again = refine_candidates(net.refiner, rc, cfg.num_classes, points, scores, labels, boxes, scale, compiled=stage2)
    assert stage2._pass is None
    torch.testing.assert_close(again[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_cpu_package_runs_refine_large_compiled(package):
    """Format v4: refine_large's whole pass is compiled into a CPU package too and gives the eager pass's values,
    for a full set of candidates and for a few (filled up); the pipeline runs it with its own eager refiner behind."""
    from livox_infer.detector.aoti import STAGE2_LARGE_PART, PackageStage2
    from livox_infer.detector.refine import refine_candidates
    from livox_infer.detector.weights import load_weights

    cfg_path, weights, pkg = package
    cfg = ModelConfig.load(cfg_path)
    rc = cfg.refine_large
    assert rc is not None  # the tiny config is models/lite.yaml's, refine_large included
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    large = runner.stage2_large
    assert runner.metadata["stage2_large"] == STAGE2_LARGE_PART and isinstance(large, PackageStage2)
    assert large.rois == rc.rois and large._features is None and large._refiner is None
    net = build_model(cfg)
    load_weights(net, cfg, weights)
    net.eval()
    large.eager_refiner = net.refiner_large
    calls = []
    compiled_pass = large._pass
    large._pass = lambda *a: calls.append(len(a[2])) or compiled_pass(*a)
    r = rc.rois + 2
    points, scores, labels, boxes = _cloud_and_candidates(rc, r, seed=6, height=4.0, size=(2.0, 6.0))
    scale = cfg.grid.intensity_scale
    for n in (r, 3):
        args = (points, scores[:n], labels[:n], boxes[:n], scale)
        want = refine_candidates(net.refiner_large, rc, cfg.num_classes, *args)
        got = refine_candidates(net.refiner_large, rc, cfg.num_classes, *args, compiled=large)
        assert torch.equal(got[1], want[1]) and len(got[0]) == min(n, rc.rois)
        for a, b in ((got[0], want[0]), (got[2], want[2])):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert calls == [rc.rois] * (2 * rc.passes)
    pipe = DetectionPipeline(cfg_path, aoti_package=pkg, sensor_height=1.5, device="cpu")
    held = pipe._stage2.compiled_refiner_large
    assert isinstance(held, PackageStage2) and held.eager_refiner is pipe._stage2.refiner_large


def test_a_cpu_package_clips_the_nms_overlaps_compiled(package):
    """Format v3: the NMS's overlap clipping is compiled into a CPU package for any count of pairs from 2, gives the
    eager areas, and the NMS keeps the same boxes with it; one pair runs eagerly, a failing part eagerly from then on."""
    from livox_infer.detector.aoti import PackagePairedArea
    from livox_infer.detector.boxes import _paired_intersection_area, bev_corners, rotated_nms

    cfg_path, _, pkg = package
    runner = AotiRunner(pkg, ModelConfig.load(cfg_path), torch.device("cpu"))
    paired = runner.paired_area
    assert isinstance(paired, PackagePairedArea)
    calls = []
    part = paired._part
    paired._part = lambda *a: calls.append(len(a[0])) or part(*a)
    rng = np.random.default_rng(7)
    for n in (3, 40):
        boxes = torch.from_numpy(np.c_[rng.uniform(0, 12, (n, 2)), np.zeros(n), rng.uniform(0.5, 5, (n, 3)),
                                       rng.uniform(-3, 3, n)])
        ca, cb = bev_corners(boxes), bev_corners(boxes.roll(1, 0))
        torch.testing.assert_close(paired(ca, cb), _paired_intersection_area(ca, cb), rtol=1e-9, atol=1e-9)
        scores, labels = torch.rand(n), torch.randint(0, 3, (n,))
        f = boxes.float()
        assert torch.equal(rotated_nms(f, scores, labels, 0.1, 64, 0.3, paired),
                           rotated_nms(f, scores, labels, 0.1, 64, 0.3))
    assert calls[0] == 3 and 40 in calls and len(calls) == 4  # two direct calls, two from the NMS
    n_calls = len(calls)
    one = bev_corners(torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.2]], dtype=torch.float64))
    paired(one, one)
    assert len(calls) == n_calls  # a single pair: eager

    def broken(*a):
        raise RuntimeError("shape check failed")

    paired._part = broken
    torch.testing.assert_close(paired(ca, cb), _paired_intersection_area(ca, cb))
    assert paired._part is None


def test_package_errors(package, tmp_path):
    cfg_path, _, pkg = package
    with pytest.raises(WeightsError, match="cannot load"):
        AotiRunner(tmp_path / "missing.pt2", ModelConfig.load(cfg_path), torch.device("cpu"))
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    record_in_manifest(junk, {})  # trusted, but still not a package
    with pytest.raises(WeightsError, match="not a loadable"):
        AotiRunner(junk, ModelConfig.load(cfg_path), torch.device("cpu"))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(_tiny_config(channels=6)))
    with pytest.raises(WeightsError, match="another architecture"):
        DetectionPipeline(other, aoti_package=pkg, sensor_height=1.5, device="cpu")
    with pytest.raises(WeightsError, match="test_time_flip"):
        DetectionPipeline(cfg_path, aoti_package=pkg, sensor_height=1.5, device="cpu", test_time_flip=True)
    with pytest.raises(WeightsError, match="precision fp32"):
        DetectionPipeline(cfg_path, aoti_package=pkg, sensor_height=1.5, device="cpu", precision="bf16")


def test_export_cli_errors(tmp_path, capsys):
    assert cli_main(["export", "--config", "lite", "--weights", str(tmp_path / "none.safetensors"),
                     "--out", str(tmp_path / "x.pt2")]) == 2
    assert "not found" in capsys.readouterr().err
    assert cli_main(["export", "--config", "lite", "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err


def test_only_packages_in_the_manifest_are_loaded(package, tmp_path, monkeypatch):
    """A package whose sha256 the project's export did not record is refused before torch loads any of it."""
    cfg_path, _, pkg = package
    cfg = ModelConfig.load(cfg_path)
    assert read_manifest()  # the fixture's export recorded its package
    loads = []
    real_load = torch._inductor.aoti_load_package
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda p, *a, **k: loads.append(p) or real_load(p, *a, **k))
    foreign = tmp_path / "foreign.pt2"
    foreign.write_bytes(pkg.read_bytes() + b"\0")  # same package, one byte more: another sha256
    for path in (foreign, tmp_path / "missing.pt2"):
        with pytest.raises(WeightsError, match="cannot load") as err:
            AotiRunner(path, cfg, torch.device("cpu"))
        assert "not found" not in str(err.value)  # the same words whether the file exists or not
    with pytest.raises(WeightsError, match="cannot load"):
        DetectionPipeline(cfg_path, aoti_package=foreign, sensor_height=1.5, device="cpu")
    assert loads == []
    monkeypatch.setenv(MANIFEST_ENV, str(tmp_path / "empty_manifest.json"))  # no manifest: nothing is trusted
    with pytest.raises(WeightsError, match="cannot load"):
        AotiRunner(pkg, cfg, torch.device("cpu"))
    assert loads == []


def test_loading_leaves_no_extracted_copies(package, tmp_path, monkeypatch):
    import tempfile

    cfg_path, _, pkg = package
    cfg = ModelConfig.load(cfg_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    ours = lambda: sorted(Path(tempfile.gettempdir()).glob("livox_infer_aoti_*"))  # noqa: E731
    before = ours()
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    record_in_manifest(junk, {})
    with pytest.raises(WeightsError):
        AotiRunner(junk, cfg, torch.device("cpu"))
    assert list(tmp_path.glob("aotinductor_*")) == [] and ours() == before
    assert os.environ["TMPDIR"] == str(tmp_path)  # restored
    x = torch.rand(1, *cfg.grid.shape).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert len(runner(x)) == 3  # still runs with its extracted files gone


def test_loading_skips_torchs_cpu_isa_probe(package, monkeypatch, caplog):
    """torch's aoti_load_package compiled and loaded a test extension per vector ISA before every load (1.4 s of a
    node's start); the runner loads without it, and a package recorded for another CPU is warned about instead."""
    import torch._inductor.cpu_vec_isa as vec_isa

    from livox_infer.detector import aoti

    def no_probe():
        raise AssertionError("the CPU ISA probe ran")

    monkeypatch.setattr(vec_isa, "pick_vec_isa", no_probe)
    cfg_path, _, pkg = package
    cfg = ModelConfig.load(cfg_path)
    runner = AotiRunner(pkg, cfg, torch.device("cpu"))
    assert runner.metadata["machine"] == aoti.machine_tag(torch.device("cpu"))
    monkeypatch.setattr(aoti, "machine_tag", lambda device: "riscv64 RVV")
    with caplog.at_level("WARNING"):
        AotiRunner(pkg, cfg, torch.device("cpu"))
    assert "this machine is riscv64 RVV: re-export it here" in caplog.text


def test_pipeline_builds_its_package_in_the_background_and_switches_to_it(package, tmp_path, monkeypatch):
    """build_package (the node's default): eager at once, the package for this machine built by a niced child, the
    pipeline on it from the next frame after, the same detections; a second pipeline loads it at start-up."""
    import time

    cfg_path, weights, _ = package
    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path / "cache"))  # no package there yet
    rng = np.random.default_rng(0)
    cloud = np.c_[rng.uniform(0, 25, (3000, 2)) * [1, 1] - [0, 12], rng.uniform(-1.5, 1.0, 3000),
                  rng.uniform(0, 255, 3000)].astype(np.float32)
    pipe = DetectionPipeline(cfg_path, weights=weights, compile=True, build_package=True, sensor_height=1.5,
                             device="cpu", precision="fp32")
    assert pipe.network_backend == "eager" and pipe.package_build_state is not None
    child = pipe._package_build.proc
    eager = pipe.detect(cloud)
    t0 = time.monotonic()
    while pipe.network_backend == "eager":
        assert pipe.package_build_error is None, pipe.package_build_error
        assert time.monotonic() - t0 < 300, "no package after 5 min"
        time.sleep(0.5)
        pipe.detect(cloud)
    assert child.poll() == 0 and pipe.package_build_state is None
    assert "switched to the AOTInductor package" in pipe.startup.summary()
    b = pipe.detect(cloud)
    assert len(eager) > 0 and len(b) == len(eager)
    assert np.allclose(eager.boxes, b.boxes, atol=1e-4) and np.allclose(eager.scores, b.scores, atol=1e-5)
    again = DetectionPipeline(cfg_path, weights=weights, compile=True, build_package=True, sensor_height=1.5,
                              device="cpu", precision="fp32")
    assert again.network_backend == "aoti" and again.package_build_state is None
