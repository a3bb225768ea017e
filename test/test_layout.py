"""The package's layering, checked statically and by importing the core with the tools blocked.

Layers, along the data flow: the runtime core (decode, ground, voxelize, detector, rig/accumulate, pipeline
and the shared parameter/utility modules) imports only the core; `bags` (rosbag I/O) adds the core; the
ROS adapter (`ros/`) adds `bags`; tools (sim, training, evaluation, bench, tools) may use everything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "livox_infer"
TOOLS = ("livox_infer.sim", "livox_infer.training", "livox_infer.evaluation", "livox_infer.bench",
         "livox_infer.tools")
ROS = ("livox_infer.ros",)
IO = ("livox_infer.bags",)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py") if "interfaces" not in p.parts}


def _layer(module: str) -> str:
    for layer, prefixes in (("tools", TOOLS), ("ros", ROS), ("io", IO)):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return "core"


ALLOWED = {"core": {"core"}, "io": {"core", "io"}, "ros": {"core", "io", "ros"},
           "tools": {"core", "io", "ros", "tools"}}


def _imports(path: Path, known: set[str], top_level_only: bool) -> set[str]:
    """livox_infer modules imported by ``path`` (all imports, or only those run at import time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in known:
                found.add(name)
    return found


def test_no_import_goes_up_a_layer():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        for dep in _imports(path, set(mods), top_level_only=False):
            if _layer(dep) not in ALLOWED[_layer(name)]:
                bad.append(f"{name} ({_layer(name)}) imports {dep} ({_layer(dep)})")
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    mods = _modules()
    # a package's __init__ importing its own submodules is not a cycle of the code
    graph = {name: {d for d in _imports(path, set(mods), top_level_only=False)
                    if not (path.name == "__init__.py" and d.startswith(name + "."))}
             for name, path in mods.items()}
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layer_rules_see_an_upward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from livox_infer.training import train\n")
    assert _imports(bad, {"livox_infer.training", "livox_infer.training.train"}, False) == {
        "livox_infer.training", "livox_infer.training.train"}


CORE_IMPORT = """
import importlib.abc, sys
BLOCKED = ("rclpy", "livox_infer.sim", "livox_infer.training", "livox_infer.evaluation", "livox_infer.bench",
           "livox_infer.tools", "livox_infer.ros", "livox_infer.bags", "rosbags", "ray", "matplotlib")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"blocked in the core: {name}")
sys.meta_path.insert(0, Block())
import numpy as np
from livox_infer.pipeline import DetectionPipeline
import livox_infer.decode.custom_msg, livox_infer.decode.pointfiles, livox_infer.rig, livox_infer.accumulate
import livox_infer.presets, livox_infer.detector.aoti
pipe = DetectionPipeline(model="lite", device="cpu", compile=False)
det = pipe.detect(np.zeros((100, 4), np.float32))
print("core ok", len(det.boxes))
"""


def test_core_imports_and_runs_with_tools_ros_and_training_blocked():
    run = subprocess.run([sys.executable, "-c", CORE_IMPORT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "core ok" in run.stdout


@pytest.mark.parametrize("blocked", ["livox_infer.training"])
def test_blocking_works(blocked):
    code = CORE_IMPORT.split("import numpy")[0] + f"import {blocked}\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "blocked in the core" in run.stderr
