"""Detection over an archive of recordings: ``livox-infer detect ARCHIVE... --out-dir DIR [--ray]``.

Inputs: directories (searched recursively for rosbag2 bags -- a directory with metadata.yaml, or a
.db3 / .mcap file -- and .pcd / .bin / .npy point files), bags or point files named directly, and
list files (``@list.txt`` or ``--inputs-from FILE``: one path per line, relative to the list file,
``#`` comments). Each input is one *job*: its frames go to ``DIR/<name>.jsonl`` (rows as
``detect --out`` writes them; ``<name>`` is the input's path below the common root of the arguments),
optionally ``DIR/<name>.annotated`` (rosbag2: clouds + Detection3DArray) and ``--bev-dir/<name>/``.

``DIR/manifest.jsonl`` gets one line per finished job (input, output, status, error, frames, boxes,
duration, model, weights sha256, settings sha256, worker), appended as jobs finish. A rerun skips
the jobs whose last line says "ok" with the same model, weights and settings and whose output
exists; failed jobs are retried. An input that fails is recorded and the run goes on; outputs
appear only complete (written to ``.part`` and renamed).

Executors: this process, one job after another (``--threads`` torch threads), or Ray (``--ray``
starts a local cluster of ``--workers`` workers, ``--ray-address`` joins one): one task per job,
each worker process loads the model once and writes the outputs itself (a shared filesystem on a
real cluster); this process writes the manifest. Both run the same :func:`detect_job` with the
same thread count, so their detections are bit-identical (timings differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from livox_infer.errors import BackendError, ConfigError, LivoxInferError, PointCloudError, WeightsError

MANIFEST_NAME = "manifest.jsonl"
BAG_FILE_SUFFIXES = (".db3", ".mcap")
ANNOTATED_SUFFIX = ".annotated"
PART_SUFFIX = ".part"
# detect options that say where and how fast to run, not what is detected: left out of the settings hash
RUN_ONLY_OPTIONS = frozenset({
    "command", "_module", "input", "out", "out_dir", "inputs_from", "ray", "ray_address", "workers", "threads",
    "bev_dir", "out_bag", "out_bag_storage", "annotated_bags",
})
# options that may name a file: made absolute (Ray workers on other nodes do not share this working directory)
PATH_OPTIONS = ("model", "weights", "aoti_package")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("archive (one output per input, resumable manifest; docs/fleet.md)")
    g.add_argument("--out-dir", default=None, help="write <input>.jsonl per input and manifest.jsonl here")
    g.add_argument("--inputs-from", default=None, metavar="FILE",
                   help="list file: one input path per line (also @FILE)")
    g.add_argument("--annotated-bags", action="store_true", help="also write <input>.annotated rosbag2 per input")
    g.add_argument("--ray", action="store_true", help="run on a local Ray cluster started now (--workers workers)")
    g.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="run on this Ray cluster: auto (this node belongs to it) or HEAD_IP:6379")
    g.add_argument("--workers", type=int, default=1, help="concurrent workers of the --ray local cluster")


def is_batch(args: argparse.Namespace) -> bool:
    """Any archive option given: the run is handled here, not by the one-output detect."""
    return bool(args.out_dir or args.inputs_from or args.ray or args.ray_address
                or any(str(x).startswith("@") for x in args.input))


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Job:
    """One input: its path and its name below the common root (the output's name, the manifest key)."""

    input: str
    name: str


def read_list_file(path: str | Path) -> list[str]:
    """Paths of a list file, relative ones resolved against the list file's directory."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read input list {path}: {exc}") from None
    entries = [line.strip() for line in lines]
    return [str(path.parent / e) for e in entries if e and not e.startswith("#")]


def _is_bag_dir(path: Path) -> bool:
    return path.is_dir() and (path / "metadata.yaml").is_file()


def find_inputs(root: Path, skip: Path | None = None) -> list[Path]:
    """Bags and point files below ``root`` (a bag directory is one input: not searched further)."""
    from livox_infer.tools.detect_io import POINT_SUFFIXES

    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if _is_bag_dir(here):
            found.append(here)
            dirnames.clear()
            continue
        # never read our own outputs when --out-dir lies inside the archive
        dirnames[:] = [d for d in dirnames if skip is None or (here / d).resolve() != skip]
        found += [here / f for f in filenames if Path(f).suffix.lower() in BAG_FILE_SUFFIXES + POINT_SUFFIXES]
    return sorted(found)


def discover(arguments: Iterable[str], inputs_from: str | None = None, skip: Path | None = None) -> list[Job]:
    """Jobs for the command-line inputs: directories searched, @FILE / ``inputs_from`` lists expanded.

    A named file or bag that does not exist is still a job: it fails and is recorded, the rest runs."""
    named: list[str] = []
    for arg in arguments:
        named += read_list_file(arg[1:]) if arg.startswith("@") else [arg]
    if inputs_from:
        named += read_list_file(inputs_from)
    roots, paths = [], []
    for arg in named:
        path = Path(arg).resolve()
        if path.is_dir() and not _is_bag_dir(path):
            roots.append(path)
            paths += find_inputs(path, skip)
        else:
            roots.append(path.parent)
            paths.append(path)
    if not paths:
        return []
    common = Path(os.path.commonpath(roots))
    unique = dict.fromkeys(paths)
    return [Job(str(p), p.relative_to(common).as_posix()) for p in unique]


# --------------------------------------------------------------------------- identity of a run


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The detect options that change what is detected (everything but RUN_ONLY_OPTIONS)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in RUN_ONLY_OPTIONS}


def model_identity(args: argparse.Namespace) -> dict[str, str]:
    """Model name, sha256 of the weights (or AOTInductor package) file, sha256 of the other settings."""
    from livox_infer.detector.config import ModelConfig
    from livox_infer.detector.aoti import file_sha256

    cfg = ModelConfig.load(args.model)
    weights = Path(args.aoti_package or args.weights or cfg.weights_path())
    if not weights.is_file():
        raise WeightsError(f"weights not found: {weights}")
    settings = json.dumps(settings_of(args), sort_keys=True, default=str)
    return {"model": cfg.name, "weights_sha256": file_sha256(weights),
            "settings_sha256": hashlib.sha256(settings.encode()).hexdigest()}


@dataclass(frozen=True)
class Settings:
    """What a worker needs to run a job (picklable: sent to Ray workers)."""

    detect_args: dict[str, Any]
    identity: dict[str, str]
    out_dir: str
    threads: int = 1
    annotated_bags: bool = False
    bag_storage: str = "sqlite3"
    bev_dir: str | None = None


def output_path(settings: Settings, job: Job) -> Path:
    return Path(settings.out_dir) / f"{job.name}.jsonl"


def annotated_path(settings: Settings, job: Job) -> Path:
    return Path(settings.out_dir) / f"{job.name}{ANNOTATED_SUFFIX}"


# --------------------------------------------------------------------------- one job (runs on a worker)

# per process: a worker loads the model once, not once per input
_PIPELINES: dict[str, Any] = {}


def _pipeline(settings: Settings):
    from livox_infer.tools.detect_io import build_pipeline

    key = json.dumps(settings.identity, sort_keys=True)
    if key not in _PIPELINES:
        _PIPELINES.clear()  # one model per worker process
        _PIPELINES[key] = build_pipeline(argparse.Namespace(**settings.detect_args))
    return _PIPELINES[key]


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _detect_frames(pipe, job: Job, settings: Settings, out, writer, bad: list[str]) -> tuple[int, int]:
    from livox_infer.tools.detect_io import detection_row, iter_inputs, write_annotated
    from livox_infer.tools.bev_plot import save_bev_png

    args = settings.detect_args
    bev_dir = Path(settings.bev_dir) / job.name if settings.bev_dir else None
    if bev_dir:
        bev_dir.mkdir(parents=True, exist_ok=True)
    frames = boxes = 0
    for source, cloud in iter_inputs([job.input], args.get("topic"), on_bad_message=bad.append):
        if args.get("max_frames") is not None and frames >= args["max_frames"]:
            break
        det = pipe.detect(cloud)
        out.write(json.dumps(detection_row(source, cloud, det)) + "\n")
        if writer is not None:
            write_annotated(writer, cloud, det)
        if bev_dir:
            save_bev_png(bev_dir / f"frame_{frames:06d}.png", cloud.points, det.boxes, det.label_names, det.scores,
                         pipe.cfg.grid.region, f"{job.name} #{frames}  {len(det)} boxes")
        frames += 1
        boxes += len(det)
    if frames == 0:
        raise PointCloudError(f"no decodable point cloud in the input ({len(bad)} bad messages; first: {bad[0]})"
                              if bad else "no point clouds found in the input")
    return frames, boxes


def _run_job(job: Job, settings: Settings, bad: list[str] | None = None) -> tuple[int, int]:
    """Detect one input into its outputs, which appear only when complete; messages that do not decode are
    appended to ``bad`` and skipped (the frames around them are kept)."""
    import torch

    from livox_infer.bags import BagWriter

    torch.set_num_threads(settings.threads)
    pipe = _pipeline(settings)
    pipe.reset_ground()  # a recording is its own scene: no ground estimate carried over from the previous job
    out = output_path(settings, job)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + PART_SUFFIX)
    bag = annotated_path(settings, job) if settings.annotated_bags else None
    # rosbag2 names its storage file after the bag directory: build it under its final name in a scratch folder
    scratch = bag.with_name(bag.name + PART_SUFFIX) if bag else None
    if scratch:
        _remove(scratch)  # left by a killed run
        scratch.mkdir()
    writer = BagWriter(scratch / bag.name, storage=settings.bag_storage) if bag else None
    try:
        with open(tmp, "w") as f:
            counts = _detect_frames(pipe, job, settings, f, writer, [] if bad is None else bad)
        if writer is not None:
            writer.close()
            writer = None
            _remove(bag)
            os.replace(scratch / bag.name, bag)
        os.replace(tmp, out)
        return counts
    finally:
        if writer is not None:
            writer.close()
        for leftover in (tmp, scratch):
            if leftover is not None:
                _remove(leftover)


def _row(job: Job, settings: Settings, status: str, error: str | None, frames: int, boxes: int,
         seconds: float, bad: list[str] | None = None) -> dict[str, Any]:
    return {
        "input": job.input, "name": job.name, "output": f"{job.name}.jsonl", "status": status, "error": error,
        "frames": frames, "boxes": boxes, "bad_messages": len(bad or []),
        **({"first_bad_message": bad[0]} if bad else {}), "duration_s": round(seconds, 3), **settings.identity,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def detect_job(job: Job, settings: Settings) -> dict[str, Any]:
    """Run one job; its manifest row. Never raises for a bad input: the error goes into the row."""
    t0 = time.perf_counter()
    bad: list[str] = []  # messages that did not decode: counted and skipped, the input's other frames kept
    try:
        frames, boxes = _run_job(job, settings, bad)
    except Exception as exc:  # noqa: BLE001 - any failure of one input is recorded; the archive run goes on
        return _row(job, settings, "failed", f"{type(exc).__name__}: {exc}", 0, 0, time.perf_counter() - t0, bad)
    return _row(job, settings, "ok", None, frames, boxes, time.perf_counter() - t0, bad)


# --------------------------------------------------------------------------- manifest


class Manifest:
    """``manifest.jsonl``: one line per finished job, appended; the last line of a name counts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: dict[str, dict[str, Any]] = {}
        self.unreadable = 0
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.last[row["name"]] = row
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.unreadable += 1  # a line cut short by a killed run: that job is simply redone

    def is_done(self, job: Job, settings: Settings) -> bool:
        row = self.last.get(job.name)
        return (row is not None and row.get("status") == "ok"
                and all(row.get(k) == v for k, v in settings.identity.items())
                and output_path(settings, job).is_file()
                and (not settings.annotated_bags or annotated_path(settings, job).is_dir()))

    def append(self, row: dict[str, Any]) -> None:
        # a line cut short by a killed run has no newline: end it first, or this row would be glued to it and be
        # unreadable too (its job redone once more)
        cut = False
        if self.path.is_file() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
        with open(self.path, "a") as f:
            f.write(("\n" if cut else "") + json.dumps(row) + "\n")
        self.last[row["name"]] = row


# --------------------------------------------------------------------------- executors


def run_here(jobs: list[Job], settings: Settings, finished: Callable[[dict], None]) -> float:
    """Jobs one after another in this process; returns the start-up time (none here)."""
    for job in jobs:
        finished(detect_job(job, settings))
    return 0.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise BackendError("--ray / --ray-address need the optional ray package: "
                           "pip install -r requirements-ray.txt (or pip install '.[ray]')") from None
    return ray


def run_on_ray(jobs: list[Job], settings: Settings, finished: Callable[[dict], None], address: str | None = None,
               workers: int = 1) -> float:
    """One Ray task per job (``settings.threads`` CPUs each); returns the cluster start-up / connect time.

    A Ray session already open in this process (tests, notebooks) is used as it is and left open."""
    ray = _import_ray()
    t0 = time.perf_counter()
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=workers * settings.threads, include_dashboard=False, logging_level=logging.WARNING)
    startup = time.perf_counter() - t0
    try:
        task = ray.remote(num_cpus=settings.threads)(detect_job)
        shared = ray.put(settings)  # stored once, not pickled into every task
        pending = {task.remote(job, shared): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died (memory, node lost): that input failed
                    row = _row(job, settings, "failed", f"{type(exc).__name__}: {exc}", 0, 0, 0.0)
                finished(row)
    finally:
        if started_here:
            ray.shutdown()
    return startup


# --------------------------------------------------------------------------- command


@dataclass
class Tally:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    frames: int = 0
    boxes: int = 0
    bad_messages: list[str] = field(default_factory=list)  # "<name>: <n> bad messages (first: ...)" per input

    def add(self, row: dict[str, Any]) -> None:
        if row["status"] == "ok":
            self.ok += 1
        else:
            self.failed.append(f"{row['name']}: {row['error']}")
        self.frames += row["frames"]
        self.boxes += row["boxes"]
        if row.get("bad_messages") and row["status"] == "ok":
            self.bad_messages.append(f"{row['name']}: {row['bad_messages']} bad messages skipped "
                                     f"(first: {row.get('first_bad_message')})")


def _check_options(args: argparse.Namespace) -> None:
    if not args.out_dir:
        raise ConfigError("@FILE, --inputs-from, --ray and --ray-address need --out-dir DIR (one output per input)")
    if args.out or args.out_bag:
        raise ConfigError("--out / --out-bag write one file; with --out-dir each input gets its own "
                          "(<input>.jsonl, --annotated-bags)")
    if args.threads < 1 or args.workers < 1:
        raise ConfigError("--threads (per archive worker) and --workers must be >= 1")
    if args.ray and args.ray_address:
        raise ConfigError("give --ray (a local cluster) or --ray-address (an existing one), not both")
    if args.ray or args.ray_address:
        _import_ray()  # a missing extra fails before any work starts


def settings_for(args: argparse.Namespace) -> Settings:
    """What the workers need: the detect options (file paths absolute), the model identity, absolute output paths."""
    args = argparse.Namespace(**vars(args))
    for key in PATH_OPTIONS:
        value = getattr(args, key, None)
        if value and Path(value).exists():
            setattr(args, key, str(Path(value).resolve()))
    return Settings(detect_args=vars(args).copy(), identity=model_identity(args),
                    out_dir=str(Path(args.out_dir).resolve()), threads=args.threads,
                    annotated_bags=args.annotated_bags, bag_storage=args.out_bag_storage or "sqlite3",
                    bev_dir=str(Path(args.bev_dir).resolve()) if args.bev_dir else None)


@dataclass
class RunReport:
    """What one archive run did: counts, and its time without (work_s) and for (startup_s) the Ray start-up."""

    tally: Tally
    inputs: int
    skipped: int
    startup_s: float
    work_s: float
    manifest: Path

    @property
    def frames_per_s(self) -> float:
        return self.tally.frames / self.work_s if self.work_s > 0 else 0.0


def run_archive(args: argparse.Namespace) -> RunReport:
    """Detect every input of the archive the options name that is not done yet; see the module docstring."""
    from tqdm import tqdm

    _check_options(args)
    out_dir = Path(args.out_dir).resolve()
    jobs = discover(args.input, args.inputs_from, skip=out_dir)
    if not jobs:
        raise PointCloudError(f"no bags or point files found in {' '.join(args.input) or args.inputs_from}")
    settings = settings_for(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(out_dir / MANIFEST_NAME)
    todo = [j for j in jobs if not manifest.is_done(j, settings)]
    executor = f"ray ({args.ray_address})" if args.ray_address else (
        f"ray (local, {args.workers} workers)" if args.ray else "this process")
    print(f"{len(jobs)} inputs, {len(jobs) - len(todo)} already done with this model and settings; "
          f"{len(todo)} to run on {executor}, {args.threads} torch thread(s) per worker", file=sys.stderr)
    tally = Tally()
    bar = tqdm(total=len(todo), desc="detect", unit="input", file=sys.stderr)

    def finished(row: dict[str, Any]) -> None:
        manifest.append(row)
        tally.add(row)
        bar.set_postfix(frames=tally.frames, boxes=tally.boxes, failed=len(tally.failed), refresh=False)
        bar.update(1)

    t0 = time.perf_counter()
    try:
        if args.ray or args.ray_address:
            startup = run_on_ray(todo, settings, finished, args.ray_address, args.workers)
        else:
            startup = run_here(todo, settings, finished)
    finally:
        bar.close()
    return RunReport(tally, len(jobs), len(jobs) - len(todo), startup, time.perf_counter() - t0 - startup,
                     manifest.path)


def main(args: argparse.Namespace) -> int:
    """Exit status 0: every input done; 1: some inputs failed (listed, and in the manifest); 2: bad options."""
    try:
        report = run_archive(args)
    except LivoxInferError as exc:
        print(f"livox-infer detect: {exc}", file=sys.stderr)
        return 2
    tally = report.tally
    print(f"{tally.ok} ok, {len(tally.failed)} failed; {tally.frames} frames, {tally.boxes} boxes in "
          f"{report.work_s:.1f} s ({report.frames_per_s:.2f} frames/s; start-up {report.startup_s:.1f} s not counted); "
          f"manifest {report.manifest}", file=sys.stderr)
    for line in tally.bad_messages[:10]:
        print(f"  kept the good frames of {line}", file=sys.stderr)
    for line in tally.failed[:10]:
        print(f"  failed: {line}", file=sys.stderr)
    if len(tally.failed) > 10:
        print(f"  ... and {len(tally.failed) - 10} more (status 'failed' in the manifest)", file=sys.stderr)
    return 1 if tally.failed else 0
