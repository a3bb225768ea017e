"""The package built in the background (livox_infer/detector/package_build.py): its child process, lock and the
pipeline staying eager when the build gives nothing. The real build and switch: test_export.py; the live node:
test_startup.py."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livox_infer.detector import package_build
from livox_infer.detector.package_build import LOCKED_EXIT, PackageBuild, lock_path, release_lock, take_lock

REPO = Path(__file__).resolve().parents[1]


def _wait(build: PackageBuild, timeout: float = 30.0):
    t0 = time.monotonic()
    while (state := build.poll()) is None:
        assert time.monotonic() - t0 < timeout, "the child never finished"
        time.sleep(0.05)
    return state


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_poll_says_building_then_built(tmp_path):
    pkg = tmp_path / "packages" / "m.cpu.abc.pt2"
    code = (f"import time, pathlib; time.sleep(0.5); p = pathlib.Path({str(pkg)!r}); p.write_bytes(b'x'); "
            "p.with_suffix('.json').write_text('{}'); print('wrote it')")
    build = PackageBuild(_python(code), pkg)
    assert build.poll() is None and build.pid is not None  # still building
    assert _wait(build) == ""
    assert build.log_path.read_text().strip() == "wrote it"


def test_a_failed_build_says_why_with_its_last_line(tmp_path):
    pkg = tmp_path / "m.cpu.abc.pt2"
    state = _wait(PackageBuild(_python("import sys; print('no compiler here'); sys.exit(2)"), pkg))
    assert "status 2" in state and "no compiler here" in state
    # exit 0 but no package (e.g. --if-missing found one for other settings): also a reason, never ""
    assert "no package at" in _wait(PackageBuild(_python("print('nothing to do')"), pkg))


def test_lock_is_taken_once_and_a_dead_owners_lock_is_taken_over(tmp_path):
    pkg = tmp_path / "m.cpu.abc.pt2"
    assert take_lock(pkg) and lock_path(pkg).read_text() == str(os.getpid())
    assert not take_lock(pkg)  # held by a live process (this one)
    release_lock(pkg)
    assert not lock_path(pkg).exists()
    dead = subprocess.run(_python("import os; print(os.getpid())"), capture_output=True, text=True).stdout.strip()
    lock_path(pkg).write_text(dead)  # its builder died
    assert take_lock(pkg)
    release_lock(pkg)


def test_a_build_locked_by_another_process_waits_for_its_package(tmp_path):
    pkg = tmp_path / "m.cpu.abc.pt2"
    assert take_lock(pkg)  # "another process" (this one) builds it
    build = PackageBuild(_python(f"import sys; sys.exit({LOCKED_EXIT})"), pkg)
    time.sleep(1.0)
    assert build.poll() is None and build.waiting_for_other
    pkg.write_bytes(b"x")
    pkg.with_suffix(".json").write_text("{}")
    assert build.poll() == ""
    pkg.unlink()  # the other builder ends without a package: a reason, not a wait for ever
    release_lock(pkg)
    assert "no package at" in build.poll()


def test_stop_ends_the_child(tmp_path):
    build = PackageBuild(_python("import time; time.sleep(60)"), tmp_path / "m.cpu.abc.pt2")
    proc = build.proc
    build.stop()
    assert proc.poll() is not None and build.proc is None


def test_export_child_gives_way_to_a_lock_and_ends_when_its_starter_has(tmp_path):
    """`export --background-of PID` (the command the pipeline starts): exits LOCKED_EXIT while another process holds
    the package's lock, and does nothing when PID is not its parent any more."""
    from livox_infer.cache import packages_dir
    from livox_infer.detector.aoti import package_fields, package_name
    from livox_infer.detector.config import ModelConfig

    env = dict(os.environ, LIVOX_INFER_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    cfg = ModelConfig.load("lite")
    import torch

    torch.set_num_threads(1)
    target = tmp_path / "packages" / package_name(package_fields(cfg, cfg.weights_path(), torch.device("cpu"), False))
    assert take_lock(target)
    try:
        out = subprocess.run(package_build.export_command("lite", cfg.weights_path(), 1, None, False),
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == LOCKED_EXIT and "builds" in out.stdout, out.stdout + out.stderr
    finally:
        release_lock(target)
    command = package_build.export_command("lite", cfg.weights_path(), 1, None, False)
    command[command.index("--background-of") + 1] = "1"  # not its parent
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "has ended" in out.stdout and not target.exists()
    assert packages_dir() != tmp_path / "packages"  # this process's own folder was never touched


def test_pipeline_stays_eager_and_says_why_when_the_build_fails(tmp_path, monkeypatch):
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.sim.simulate import simulate_frame

    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(package_build, "export_command",
                        lambda *a, **k: _python("import sys; print('export broke'); sys.exit(1)"))
    pipe = DetectionPipeline("lite", compile=True, build_package=True, device="cpu")
    assert pipe.network_backend == "eager" and pipe.package_build_state.startswith("building lite.cpu.")
    assert "eager until the AOTInductor package being built in the background is ready" in pipe.startup.summary()
    f = simulate_frame("avia", 5, scene="street")
    first = pipe.detect(f.points)
    t0 = time.monotonic()
    while pipe.package_build_state is not None:
        assert time.monotonic() - t0 < 30
        time.sleep(0.1)
        pipe.detect(f.points)
    assert pipe.network_backend == "eager" and "export broke" in pipe.package_build_error
    assert len(pipe.detect(f.points)) == len(first) > 0  # frames go on as before
    # a rebuild (another setting) or close() stops a build that is still running
    monkeypatch.setattr(package_build, "export_command", lambda *a, **k: _python("import time; time.sleep(60)"))
    pipe.update(test_time_flip=True)
    proc = pipe._package_build.proc
    pipe.update(test_time_flip=False)
    assert proc.poll() is not None and pipe.network_backend == "eager"
    proc = pipe._package_build.proc
    pipe.close()
    assert proc.poll() is not None and pipe.package_build_state is None


def test_offline_commands_never_build_in_the_background():
    from livox_infer.presets import cli_pipeline_options

    assert cli_pipeline_options("avia", {}, {}, {})["build_package"] is False
    assert cli_pipeline_options(None, {}, {"model": "lite"}, {"build_package": True})["build_package"] is False
