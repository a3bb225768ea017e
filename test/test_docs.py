"""The docs state facts; where checking one is cheap, it is checked here against the code.

- grid facts (cell size, extent, z range, slices, channels) in docs/voxelizer.md and docs/detector.md
  equal `ModelConfig.load(name).grid` for the shipped model configs;
- every repository path (`livox_infer/...`, `docs/...`, `models/...`, ...) and every relative Markdown link
  in README.md / docs/ / models/ names something that exists;
- every `livox-infer ...` line of the README's shell blocks parses with the real argparse parser (built by
  `livox_infer.tools.cli.build_parser`, the command itself is not run), pipes only into real programs, and
  reads only bags an earlier README line writes or files that exist;
- the module names in docs/ARCHITECTURE.md import, and the call signatures it writes out as
  `` `livox_infer.module.function(a, b, c=...)` `` name the function's parameters, in order, required ones
  included;
- the test lanes the README promises exist (`make test` runs everything, `make test-fast` `-m "not slow"`).
"""

from __future__ import annotations

import importlib
import inspect
import re
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MODEL_CARDS = sorted((REPO / "models").glob("*.md"))
DOC_FILES = [README, *DOCS, *MODEL_CARDS]



def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


# ------------------------------------------------------------------------------------------ grid facts
def _table_rows(text: str, header_start: str) -> list[list[str]]:
    """Cells of the rows of the first Markdown table whose header line starts with `header_start`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"no table starting {header_start!r}")


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", cell.replace("\u2212", "-"))]


@pytest.fixture(scope="module")
def model_grids():
    from livox_infer.detector.config import ModelConfig

    return {name: ModelConfig.load(name) for name in ("lite", "full")}


def test_voxelizer_grid_table_matches_the_model_configs(model_grids):
    rows = _table_rows((REPO / "docs/voxelizer.md").read_text(), "| model | x range")
    seen = set()
    for cells in rows:
        name = cells[0].strip("`")
        cfg = model_grids[name]
        g = cfg.grid
        seen.add(name)
        assert _numbers(cells[1]) == list(g.x_range), (name, "x range")
        assert _numbers(cells[2]) == list(g.y_range), (name, "y range")
        assert _numbers(cells[3]) == [g.cell_size], (name, "cell")
        assert _numbers(cells[4]) == [g.height, g.width], (name, "H x W")
        assert _numbers(cells[5]) == list(g.z_range), (name, "z range")
        assert _numbers(cells[6]) == [g.z_quantum, g.z_levels], (name, "z quantum / levels")
        assert _numbers(cells[7]) == [g.n_height_slices], (name, "slices")
        assert cells[8].lower().startswith("yes" if g.xy_offsets else "no"), (name, "xy offsets")
        assert _numbers(cells[9]) == [g.shape[0]], (name, "C")
    assert seen == set(model_grids)


def test_detector_model_table_matches_the_model_configs(model_grids):
    rows = {c[0]: c[1:] for c in _table_rows((REPO / "docs/detector.md").read_text(), "| | lite")}
    lite, full = model_grids["lite"], model_grids["full"]
    for col, cfg in enumerate((lite, full)):
        g = cfg.grid
        assert _numbers(rows["input (C x H x W)"][col])[:3] == list(g.shape), cfg.name
        assert _numbers(rows["cell / head cell (m)"][col]) == [g.cell_size, cfg.head_cell_size], cfg.name
        assert _numbers(rows["z range above ground (m), slices"][col]) == [*g.z_range, g.n_height_slices], cfg.name
        assert _numbers(rows["grid x, y (m)"][col]) == [*g.x_range, *g.y_range], cfg.name


def test_rigs_page_preset_grids_match_the_presets(model_grids):
    """docs/rigs.md's per-sensor grid table: each preset's bev_extent and the cells it makes on the lite grid."""
    from livox_infer.presets import load_preset

    cell = model_grids["lite"].grid.cell_size
    rows = {c[0]: c[1:] for c in _table_rows((REPO / "docs/rigs.md").read_text(), "| preset | `bev_extent`")}
    for sensor in ("mid40", "mid70", "tele15", "horizon", "avia"):
        x0, x1, y0, y1 = (float(v) for v in load_preset(sensor)["bev_extent"])
        nums = _numbers(rows[sensor][0].replace("..", " "))
        assert nums[:2] == [x0, x1] and abs(nums[2]) == y1 == -y0, sensor
        assert _numbers(rows[sensor][1]) == [round((x1 - x0) / cell), round((y1 - y0) / cell)], sensor


def test_node_page_preset_table_matches_the_presets():
    """docs/node.md's preset table: ROI x / y / z and max_range of each sensor preset."""
    from livox_infer.presets import load_preset

    rows = {c[0]: c[1:] for c in _table_rows((REPO / "docs/node.md").read_text(), "| preset | FOV")}
    for sensor in ("mid40", "mid70", "tele15", "horizon", "avia"):
        p = load_preset(sensor)
        x, y, z = (_numbers(part.replace("\u2013", " ").replace("–", " ").replace("±", ""))
                   for part in rows[sensor][1].split("/"))
        assert x == [p["roi_x_min"], p["roi_x_max"]], sensor
        assert y == [p["roi_y_max"]] and p["roi_y_min"] == -p["roi_y_max"], sensor
        assert z == [p["roi_z_min"], p["roi_z_max"]], sensor
        assert _numbers(rows[sensor][2]) == [p["max_range"]], sensor


def test_detector_page_facts_about_the_shipped_weights():
    """Parameter counts, largest value and content hash that docs/detector.md states for models/lite.safetensors."""
    from safetensors.torch import load_file

    from livox_infer.detector.weights import read_metadata

    path = REPO / "models/lite.safetensors"
    tensors = load_file(str(path))
    learned = {k: v for k, v in tensors.items() if "running_" not in k and "num_batches" not in k}
    stage1 = sum(v.numel() for k, v in learned.items() if not k.startswith(("refiner.", "refiner_large.")))
    stage2 = sum(v.numel() for k, v in learned.items() if k.startswith("refiner."))
    large = sum(v.numel() for k, v in learned.items() if k.startswith("refiner_large."))
    rows = {c[0]: c[1:] for c in _table_rows((REPO / "docs/detector.md").read_text(), "| | lite")}
    m, k, k_large = _numbers(rows["parameters"][0])[:3]
    assert round(stage1 / 1e6, 2) == m and round(stage2 / 1e3) == k and round(large / 1e3) == k_large, \
        (stage1, stage2, large)
    from livox_infer.detector.config import ModelConfig
    from livox_infer.detector.network import build_model

    full = sum(p.numel() for p in build_model(ModelConfig.load("full")).parameters())
    assert _numbers(rows["parameters"][1]) == [round(full / 1e6, 1)], full
    largest = max(float(v.abs().max()) for v in tensors.values() if v.is_floating_point())
    text = (REPO / "docs/detector.md").read_text()
    assert f"the shipped lite file's largest is {largest:.0f}" in text
    assert "content_sha256" in read_metadata(path) and "`lite.safetensors` records one" in text


# ------------------------------------------------------------------------------------------ paths and links
_PATH = re.compile(r"(?<![\w/.~$-])((?:livox_infer|docs|models|config|scripts|test|launch)/[\w./-]*[\w/])")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _mentioned_paths(doc: Path) -> set[str]:
    text = doc.read_text()
    found = set()
    for m in _PATH.finditer(text):
        p = m.group(1)
        after = text[m.end():m.end() + 1]
        if after in "<*{" and after:  # a pattern such as interfaces/<pkg>/msg/*.msg, not a path
            continue
        found.add(p.rstrip("."))
    return found


def _exists(path: str) -> bool:
    return (REPO / path).exists()


@pytest.mark.parametrize("doc", DOC_FILES, ids=_rel)
def test_repository_paths_in_docs_exist(doc):
    missing = sorted(p for p in _mentioned_paths(doc) if not _exists(p))
    assert not missing, f"{_rel(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOC_FILES, ids=_rel)
def test_relative_links_in_docs_exist(doc):
    missing = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        resolved = (doc.parent / target).resolve()
        rel = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)
        if not _exists(rel):
            missing.append(target)
    assert not missing, f"{_rel(doc)} links to missing files: {missing}"


# ------------------------------------------------------------------------------------------ README commands
def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _commands_in(doc: Path, synopses: bool = True) -> list[list[str]]:
    """Every `livox-infer ...` invocation in a page's bash blocks, in order, as argv (comments removed; the
    loops' `$s` and `$PWD` expanded). `synopses=False` leaves out usage lines (`[--option ...]`, `--help`)."""
    commands = []
    for block in _shell_blocks(doc.read_text()):
        for line in block.splitlines():
            code = line.split(" #", 1)[0]
            if not synopses and (" [" in code or "..." in code or "--help" in code):
                continue
            tokens = shlex.split(line.replace("$PWD", str(REPO)).replace("$s", "1"), comments=True)
            for segment in _segments(tokens):
                if segment and segment[0] == "livox-infer":
                    commands.append(segment[1:])
    return commands


def _readme_commands() -> list[list[str]]:
    return _commands_in(README)


def _docs_commands() -> list[tuple[str, list[str]]]:
    """Concrete commands in the pages' bash blocks (the log keeps the CLI of its day)."""
    return [(d.name, argv) for d in DOCS if d.name != "log.md" for argv in _commands_in(d, synopses=False)]


def _segments(tokens: list[str]) -> list[list[str]]:
    """Split a token list at ; && || | and drop the loop keywords, leaving simple commands."""
    out, cur = [], []
    for t in tokens:
        if t in (";", "&&", "||", "|") or t.endswith(";"):
            if t.endswith(";") and t != ";":
                cur.append(t[:-1])
            out.append(cur)
            cur = []
        elif not cur and t in ("do", "then", "for", "done"):
            continue
        else:
            cur.append(t)
    out.append(cur)
    return [s for s in out if s]


def _readme_inline_commands() -> list[list[str]]:
    """`livox-infer ...` commands written inline (the benchmark table names the command behind each number)."""
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    return [shlex.split(c)[1:] for c in re.findall(r"`(livox-infer [^`]+)`", text)]


def test_readme_has_livox_infer_commands():
    assert len(_readme_commands()) >= 15


@pytest.mark.parametrize("argv", _readme_commands() + _readme_inline_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses_with_the_real_cli(argv):
    from livox_infer.tools import cli

    parser = cli.build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`livox-infer {' '.join(argv)}` does not parse (exit {exc.code})")
    assert args.command == argv[0]


@pytest.mark.slow  # builds the eager pipeline and detects one real scan: ~5 s
def test_readme_python_block_runs_as_written():
    if not (REPO.parent / "shared/data/livox_horizon").is_dir():
        pytest.skip("../shared/data is not here")
    block = re.search(r"```python\n(.*?)```", README.read_text(), flags=re.S).group(1)
    import contextlib
    import io
    import os

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert "(" in out.getvalue()  # it printed the boxes' shape


@pytest.mark.parametrize("page,argv", _docs_commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x)[:50])
def test_docs_commands_parse_with_the_real_cli(page, argv):
    from livox_infer.tools import cli

    try:
        cli.build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"docs/{page}: `livox-infer {' '.join(argv)}` does not parse (exit {exc.code})")


def test_readme_pipes_go_into_real_programs():
    """`livox-infer bench decode | voxelize | pipeline` once read as a shell pipe into programs that do not exist."""
    bad = []
    for block in _shell_blocks(README.read_text()):
        for line in block.splitlines():
            code = line.split(" #", 1)[0]
            for part in code.split("|")[1:]:
                if part.startswith("|") or not part.strip():  # || or a trailing pipe
                    continue
                program = part.split()[0]
                if shutil.which(program) is None and program not in ("head", "tail", "grep", "tee", "jq", "less"):
                    bad.append(line.strip())
    assert not bad, f"README lines pipe into programs that do not exist: {bad}"


BAG_READERS = {"replay": 0, "detect": 0, "eval": 0}


def test_readme_reads_only_bags_that_an_earlier_line_writes_or_that_exist():
    """`replay drive.db3` once named a bag nothing made; `--out drive.mcap` and `--out-bag x.mcap` name bag
    *directories* (rosbags writes DIR/DIR.mcap or DIR/DIR.db3, with the storage --storage picks), so a bag
    name with a storage suffix promises a file that is not there."""
    written: set[str] = set()
    problems = []
    for argv in _readme_commands():
        command = argv[0]
        for flag in ("--out", "--out-bag"):
            if flag in argv and command in ("simulate", "detect"):
                value = argv[argv.index(flag) + 1]
                if command == "simulate" or flag == "--out-bag":
                    if value.endswith((".mcap", ".db3")):
                        problems.append(f"{' '.join(argv)}: {flag} {value} is a directory, not a {value[-4:]} file")
                    written.update({value, str(Path(value).parent)})
        if "--out-dir" in argv:
            written.add(argv[argv.index("--out-dir") + 1])
        if command in BAG_READERS:
            for value in _positionals(argv[1:]):
                if value in written or (REPO / value).exists() or value.startswith("../shared"):
                    continue
                problems.append(f"{' '.join(argv)}: reads {value}, which no earlier README line writes")
    assert not problems, "\n".join(problems)


def _positionals(args: list[str]) -> list[str]:
    """Arguments before the first option (the README writes inputs first)."""
    out = []
    for a in args:
        if a.startswith("-"):
            break
        out.append(a)
    return out


# ------------------------------------------------------------------------------------------ ARCHITECTURE.md
def _architecture() -> str:
    return (REPO / "docs/ARCHITECTURE.md").read_text()


def _resolve(dotted: str):
    """Import `dotted` as a module, or as an attribute of its longest importable prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name in ("rclpy",) or (exc.name or "").endswith("_msgs"):
                pytest.skip(f"{dotted} needs {exc.name} (the ROS environment)")
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _architecture_names() -> list[str]:
    return sorted(set(re.findall(r"`(livox_infer(?:\.\w+)+)", _architecture())))


@pytest.mark.parametrize("dotted", _architecture_names())
def test_architecture_names_import(dotted):
    _resolve(dotted)


def test_architecture_layer_table_names_every_module():
    """The map is complete: each module of the package is named in the layer table (`name` under its package)."""
    text = _architecture()
    table = text[text.index("## Layers"):text.index("## Data flow")]
    missing = []
    for path in sorted((REPO / "livox_infer").rglob("*.py")):
        if "interfaces" in path.parts or path.name == "__init__.py" and path.parent.name == "livox_infer":
            continue
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        dotted, package = ".".join(parts), ".".join(parts[:-1])
        named = f"`{dotted}`" in table or (f"`{package}`" in table and f"`{parts[-1]}`" in table)
        if not named:
            missing.append(dotted)
    assert not missing, f"docs/ARCHITECTURE.md's layer table does not name: {missing}"


def _split_top_level(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _architecture_signatures() -> list[tuple[str, str]]:
    return re.findall(r"`(livox_infer(?:\.\w+)+)\(([^`]*?)\)(?: ->[^`]*)?`", _architecture())


def test_architecture_writes_out_signatures():
    assert len(_architecture_signatures()) >= 8


@pytest.mark.parametrize("dotted,params", _architecture_signatures(), ids=lambda x: x if "." in x else "")
def test_architecture_signatures_match_the_code(dotted, params):
    obj = _resolve(dotted)
    sig = inspect.signature(obj)
    names = [p for p in sig.parameters if p not in ("self", "cls")]
    listed = []
    for item in _split_top_level(params):
        if item in ("*", "...", "/") or item.startswith("**"):
            continue
        listed.append(re.split(r"[=:]", item, maxsplit=1)[0].strip().lstrip("*"))
    unknown = [n for n in listed if n not in names]
    assert not unknown, f"{dotted}: no parameter(s) {unknown}; the code has {names}"
    order = [names.index(n) for n in listed]
    assert order == sorted(order), f"{dotted}: parameters out of order; the code has {names}"
    if "..." not in params:
        required = [n for n, p in sig.parameters.items() if n not in ("self", "cls")
                    and p.default is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        left_out = [n for n in required if n not in listed]
        assert not left_out, f"{dotted}: required parameter(s) {left_out} not written out"


def test_detection_yaw_range_is_what_the_docs_say():
    """Published yaw is the box axis modulo pi (the network cannot tell front from back)."""
    import numpy as np

    from livox_infer.detector.boxes import axis_angle

    yaw = axis_angle(np.linspace(-10, 10, 2001))
    assert yaw.min() >= -np.pi / 2 and yaw.max() < np.pi / 2
    assert "[-pi/2, pi/2)" in _architecture()
    src = (REPO / "livox_infer/pipeline.py").read_text()
    assert "axis_angle(boxes_np[:, 6])" in src  # the pipeline's last word on yaw


# ------------------------------------------------------------------------------------------ test lanes
def test_make_test_fast_deselects_slow_tests_and_make_test_runs_all():
    makefile = (REPO / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    full = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert fast and full
    assert "-m 'not slow'" in fast.group(1) or '-m "not slow"' in fast.group(1)
    assert not re.search(r"pytest[^|]*\s-m\s", full.group(1))  # CI's lane deselects nothing
    ini = (REPO / "pytest.ini").read_text()
    assert re.search(r"^\s+slow:", ini, flags=re.M), "the slow marker is registered"
    head = README.read_text().split("\n## ", 1)[0]
    assert "make test " in head and "make test-fast" in README.read_text()
    assert "make test" in (REPO / ".ci/run").read_text()
