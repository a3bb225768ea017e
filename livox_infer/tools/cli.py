"""``livox-infer`` command line: one subcommand per job, each implemented next to its code.

Each command module exposes ``add_arguments(parser)`` and ``main(args) -> int``; they are
imported lazily so ``livox-infer --help`` stays fast and a missing optional dependency
only affects the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from livox_infer.errors import LivoxInferError

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("livox_infer.sim.cli", "simulate Livox scans with ground truth into a rosbag2"),
    "train": ("livox_infer.training.cli", "train the detector on simulated scans"),
    "eval": ("livox_infer.evaluation.evaluate", "average precision against ground truth"),
    "detect": ("livox_infer.tools.detect", "run the detector over a bag or point files, or an archive of them (--out-dir, Ray)"),
    "run": ("livox_infer.ros.node", "start the ROS 2 detector node from a preset YAML (no ros2 launch needed)"),
    "replay": ("livox_infer.ros.replay", "publish a bag's clouds into ROS with recorded timing"),
    "echo": ("livox_infer.ros.echo", "print the node's detections per frame (no RViz needed)"),
    "export": ("livox_infer.tools.export", "AOTInductor package of the network for machines without a compiler"),
    "params": ("livox_infer.tools.params", "the parameter reference, base preset and JSON schema, generated from one table"),
    "demo": ("livox_infer.tools.demo", "simulated Avia drive -> ROS 2 node -> detections vs ground truth (+ BEV picture)"),
}

# ``livox-infer bench TARGET``
BENCHES: dict[str, tuple[str, str]] = {
    "decode": ("livox_infer.bench.decode", "PointCloud2 decoding vs sensor_msgs_py"),
    "voxelize": ("livox_infer.bench.voxelize", "Triton voxelizer vs torch eager / compiled"),
    "pipeline": ("livox_infer.bench.pipeline", "decode -> voxelize -> network -> boxes, eager vs compiled"),
    "startup": ("livox_infer.bench.startup", "node start to first detection, inductor cache cold and warm"),
    "fleet": ("livox_infer.bench.fleet", "detection over an archive: frames/s in one process vs Ray, by workers"),
}

def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="livox-infer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = argv[0] if argv else None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    bench = sub.add_parser("bench", help="benchmarks that print a table")
    bsub = bench.add_subparsers(dest="target", required=True)
    bchosen = argv[1] if chosen == "bench" and len(argv) > 1 else None
    for name, (module, help_) in BENCHES.items():
        p = bsub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        if name == bchosen:
            importlib.import_module(module).add_arguments(p)
    return parser

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    name = " ".join(x for x in (args.command, getattr(args, "target", None)) if x)
    try:
        module = importlib.import_module(args._module)  # seconds for the torch / rclpy commands
        if getattr(args, "threads", None) is not None:  # before the command's first torch work starts the pools
            from livox_infer.threads import apply_threads

            apply_threads(args.threads)
        return int(module.main(args) or 0)
    except LivoxInferError as exc:  # a typed error the command did not report itself: one line, no traceback
        print(f"livox-infer {name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C that the command did not handle (e.g. while its modules load): one line
        print(f"livox-infer {name}: interrupted", file=sys.stderr, flush=True)
        return 130

if __name__ == "__main__":
    sys.exit(main())
