"""`livox-infer train`: a recipe file (every stage, into one directory) or one run configured by flags.

    livox-infer train models/lite.train.yaml --out DIR [--from STAGE] [--until STAGE] [--scale F]
    livox-infer train --model lite --steps 200 ...            (flags: training/train.py add_arguments)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.training import recipe as recipe_mod
from livox_infer.training import train as train_mod


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", default=None,
                   help="a training recipe (e.g. models/lite.train.yaml): run all its stages into the directory "
                        "--out (resumable; docs/training.md). Without it: one run configured by the flags below")
    p.add_argument("--from", dest="start", default=None, metavar="STAGE",
                   help="recipe: start at this stage (the weights its init names must exist in --out)")
    p.add_argument("--until", default=None, metavar="STAGE", help="recipe: stop after this stage")
    p.add_argument("--scale", type=float, default=1.0,
                   help="recipe: multiply frame counts, steps and validation intervals by this (e.g. 0.0002 for a "
                        "smoke run of every stage; not the recipe's weights)")
    train_mod.add_arguments(p)


# flags that say how or where a recipe runs; every other flag configures a single run and is refused with a recipe
RECIPE_FLAGS = {"recipe", "out", "start", "until", "scale", "threads", "workers", "device", "write_models"}


def run_recipe_cli(args: argparse.Namespace) -> int:
    from livox_infer.resources import find

    if not args.out:
        raise ConfigError("a recipe runs into a directory: give it with --out DIR")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    ignored = sorted(k for k, v in vars(args).items() if k in defaults and k not in RECIPE_FLAGS and v != defaults[k])
    if ignored:
        raise ConfigError(f"the recipe sets what --{', --'.join(k.replace('_', '-') for k in ignored)} would: "
                          "edit the recipe (or drop the recipe for a single run)")
    try:
        path = find("models", args.recipe)  # a path, or a recipe shipped in models/ (lite.train.yaml)
    except FileNotFoundError:
        raise ConfigError(f"no training recipe {args.recipe!r} (a path, or a file in the package's models/)") from None
    recipe = recipe_mod.scaled(recipe_mod.load_recipe(path), args.scale)
    runtime = recipe_mod.Runtime(args.threads, args.workers, args.device, args.write_models)
    print(recipe_mod.run_recipe(recipe, Path(args.out), args.until, runtime, start=args.start))
    return 0


def main(args: argparse.Namespace) -> int:
    if not args.recipe:
        return train_mod.main(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        return run_recipe_cli(args)
    except LivoxInferError as exc:
        print(f"livox-infer train: {exc}", file=sys.stderr)
        return 2
