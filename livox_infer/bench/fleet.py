"""``livox-infer bench fleet ARCHIVE``: archive detection throughput (frames/s), one process vs Ray, by workers.

Runs ``livox-infer detect ARCHIVE --out-dir <fresh temp dir>`` once per row: this process with 1..N torch
threads, then a local Ray cluster with 1..N workers of one thread each. The time of a row excludes the
Ray cluster start-up (its own column) but includes loading the model in every worker, as a real run
does. Make the archive with ``livox-infer simulate`` (docs/fleet.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

from livox_infer.errors import ConfigError
from livox_infer.params import add_cli_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", help="directory of bags / point files (searched recursively)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (this process: torch threads)")
    add_cli_options(p, ("model", "compile"), compile=False,
                    helps={"compile": "torch.compile in every worker (default: eager)"})
    p.add_argument("--no-ray", action="store_true", help="only the rows of this process")


def _detect_args(argv: list[str]) -> argparse.Namespace:
    from livox_infer.tools import detect as detect_cli

    p = argparse.ArgumentParser(prog="livox-infer detect")
    detect_cli.add_arguments(p)
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    from livox_infer.tools import fleet

    try:
        counts = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--workers must be comma-separated integers, got {args.workers!r}") from None
    rows = [("this process", n, ["--threads", str(n)]) for n in counts]
    have_ray = importlib.util.find_spec("ray") is not None
    if not args.no_ray and have_ray:
        rows += [("ray (local)", n, ["--ray", "--workers", str(n)]) for n in counts]
    results = []
    with tempfile.TemporaryDirectory(prefix="livox_bench_fleet_") as tmp:
        for k, (executor, workers, extra) in enumerate(rows):
            argv = [args.archive, "--out-dir", str(Path(tmp) / f"run{k}"), "--model", args.model, *extra]
            report = fleet.run_archive(_detect_args(argv + ([] if args.compile else ["--no-compile"])))
            if report.tally.failed:
                raise ConfigError(f"{len(report.tally.failed)} inputs failed, e.g. {report.tally.failed[0]}")
            threads = workers if executor == "this process" else 1
            results.append((executor, workers, threads, report))
    print(f"\narchive {args.archive}: {results[0][3].inputs} inputs, {results[0][3].tally.frames} frames, "
          f"model {args.model}, {'compiled' if args.compile else 'eager'}")
    print(f"{'executor':<14}{'workers':>8}{'threads':>8}{'start-up s':>12}{'time s':>9}{'frames/s':>10}")
    for executor, workers, threads, r in results:
        print(f"{executor:<14}{workers:>8}{threads:>8}{r.startup_s:>12.1f}{r.work_s:>9.1f}{r.frames_per_s:>10.2f}")
    if not args.no_ray and not have_ray:
        print("(ray is not installed: no Ray rows; pip install -r requirements-ray.txt)")
    return 0
