"""Loading an AOTInductor package (.pt2 from `livox-infer export`) as code that is trusted explicitly.

The package is native code (a shared library whose constructors run when it is loaded), so it is
trusted like code: `livox_infer.tools.export.export_package` records the sha256 of every package it writes
in a manifest (`manifest_path()`: ``$LIVOX_INFER_AOTI_MANIFEST``, else
``$XDG_CONFIG_HOME/livox_infer/aoti_manifest.json``, else ``~/.config/livox_infer/aoti_manifest.json``), and
`AotiRunner` refuses any package whose bytes hash to a value not listed there, before any of it is loaded.
The checked bytes are copied into a private temporary directory and loaded from there (no swap between
check and load), and torch's extraction goes into that directory too, which is removed afterwards. A
package is also tied to the model config it was exported with (architecture hash in its metadata, checked
at load), to the CPU ISA / GPU it was built for, and to the torch version (re-export after upgrading torch).
The manifest also lists torch.compile's saved compiled functions (`livox_infer.detector.precompiled`), code too.
"""


from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from livox_infer.errors import LivoxInferError, WeightsError
from livox_infer.detector.config import ModelConfig

log = logging.getLogger("livox_infer.export")
# v3 (2026-12-05): a CPU package holds stage 2's compiled parts (v2 had features and refiner, v3 adds a whole pass)
# and the NMS's clipping; v4 (2026-12-06) also refine_large's whole pass. Older packages still load when named (the
# missing parts run eagerly), but are no longer picked from the cache, so `make setup` and the node rebuild them
PACKAGE_FORMAT = "livox_infer.aoti.v4"
LOADABLE_FORMATS = ("livox_infer.aoti.v1", "livox_infer.aoti.v2", "livox_infer.aoti.v3", PACKAGE_FORMAT)
MANIFEST_FORMAT = "livox_infer.aoti_manifest.v1"
MANIFEST_ENV = "LIVOX_INFER_AOTI_MANIFEST"
MAX_PACKAGE_BYTES = 1 << 30  # a lite package is ~1 MB; nothing legitimate comes near this



def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_path() -> Path:
    """Where the list of trusted packages (sha256 of each package `export_package` wrote) lives."""
    if os.environ.get(MANIFEST_ENV):
        return Path(os.environ[MANIFEST_ENV])
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "livox_infer" / "aoti_manifest.json"


def read_manifest(path: Path | None = None) -> dict[str, dict]:
    """{sha256: entry} of the trusted packages; empty when there is no (readable) manifest."""
    path = path or manifest_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    packages = doc.get("packages") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT else None
    return packages if isinstance(packages, dict) else {}


def record_in_manifest(package: Path, entry: dict[str, str], path: Path | None = None) -> Path:
    """Add ``package``'s sha256 to the manifest (atomically replaced); returns the manifest's path."""
    path = path or manifest_path()
    packages = read_manifest(path)
    packages[file_sha256(package)] = {**entry, "file": package.name,
                                      "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, "packages": packages}, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path


def trusted_bytes(path: Path) -> bytes:
    """The package's bytes, if their sha256 is in the manifest; WeightsError (nothing loaded) otherwise."""
    refused = WeightsError(f"cannot load AOTInductor package {path}: only packages `livox-infer export` wrote "
                           f"(sha256 listed in {manifest_path()}) are loaded")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PACKAGE_BYTES + 1)
    except OSError:
        raise refused from None
    if len(data) > MAX_PACKAGE_BYTES or hashlib.sha256(data).hexdigest() not in read_manifest():
        raise refused
    return data


def extent_text(cfg: ModelConfig) -> str:
    """The grid's BEV extent as the package metadata records it: "x_min,x_max,y_min,y_max" in metres."""
    (x0, x1), (y0, y1) = cfg.grid.x_range, cfg.grid.y_range
    return ",".join(f"{float(v):g}" for v in (x0, x1, y0, y1))


def _grid_mismatch(meta: dict[str, str], cfg: ModelConfig) -> str | None:
    """Why the architecture hashes differ when the only difference is the grid's extent, else None."""
    recorded = meta.get("bev_extent")
    if not recorded or recorded == extent_text(cfg):
        return None
    try:
        same_net = cfg.with_extent([float(v) for v in recorded.split(",")]).architecture_hash() == meta.get("architecture_hash")
    except (LivoxInferError, ValueError):
        return None
    if not same_net:
        return None
    return (f"was exported for the grid bev_extent [{recorded}] and the pipeline's grid is [{extent_text(cfg)}] "
            "(same model and architecture, another detection grid); export it again for this grid: "
            "`livox-infer export --sensor <the preset>` or `--bev-extent X_MIN X_MAX Y_MIN Y_MAX`")


def _check_metadata(meta: dict[str, str], path: Path, cfg: ModelConfig, device: torch.device, flip: bool,
                    precision: str | None = None) -> None:
    """A package of this project, for this architecture and grid, device, test-time flip setting and (when given)
    precision, or WeightsError."""
    if meta.get("format") not in LOADABLE_FORMATS:
        raise WeightsError(f"{path}: not a livox_infer package (format={meta.get('format')!r})")
    if meta.get("architecture_hash") != cfg.architecture_hash():
        grid = _grid_mismatch(meta, cfg)
        if grid:
            raise WeightsError(f"{path} {grid}")
        what = ("another architecture" if meta.get("bev_extent") else
                "another architecture or detection grid (an older package that does not record its grid)")
        raise WeightsError(
            f"{path} was exported for model config {meta.get('config_name')!r} with {what} "
            f"than {cfg.source or cfg.name}; export it again with this config"
        )
    if meta.get("device_type") != device.type:
        raise WeightsError(f"{path} was built for {meta.get('device_type')}, the pipeline runs on {device.type}")
    if meta.get("test_time_flip", "no") != ("yes" if flip else "no"):
        raise WeightsError(f"{path} was exported with test_time_flip={meta.get('test_time_flip', 'no')}; "
                           "export it again or change test_time_flip")
    if precision is not None and meta.get("precision", "fp32") != precision:
        raise WeightsError(f"{path} was exported with precision {meta.get('precision', 'fp32')}; export it again "
                           f"with --precision {precision} or set precision to auto")
    if meta.get("torch_version") != torch.__version__:
        log.warning("%s was exported with torch %s, running torch %s: re-export if it misbehaves",
                    path, meta.get("torch_version"), torch.__version__)
    if meta.get("machine") and meta["machine"] != machine_tag(device):
        log.warning("%s was built for %s, this machine is %s: re-export it here if it misbehaves",
                    path, meta["machine"], machine_tag(device))


class _PackageModel:
    """A loaded package, called with positional tensors: what torch's AOTICompiledModel does for that case, without
    importing torch.export's archive module for it (1.4 s of a node's start-up on 2 cores)."""

    def __init__(self, loader) -> None:
        from torch.utils import _pytree as pytree

        self._pytree = pytree
        self.loader = loader
        self._out_spec = pytree.treespec_loads(loader.get_call_spec()[1])

    def __call__(self, *args: torch.Tensor):
        flat = [x for x in self._pytree.tree_flatten(args)[0] if isinstance(x, torch.Tensor)]
        return self._pytree.tree_unflatten(self.loader.boxed_run(flat), self._out_spec)

    def get_metadata(self) -> dict[str, str]:
        return self.loader.get_metadata()


def _load_package(file: str, name: str = "model"):
    """torch's aoti_load_package without its device probe: before loading, torch finds the CPU's vector ISA by
    building and loading a test extension per ISA (pick_vec_isa: 1.4 s of a 4 s node start on 2 cores), only to
    warn on a mismatch, which _check_metadata does from the package's recorded ``machine`` for free. ``name``: which
    of the package's compiled models (the network is "model"; STAGE2_PARTS name the others)."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(file, name, False, 1, -1)
        return _PackageModel(loader)
    except (ImportError, AttributeError):  # another torch's internals: its own loader, probe included
        return torch._inductor.aoti_load_package(file, model_name=name)


# a package's metadata "stage2": the compiled models beside "model" (format v2 had the first two)
STAGE2_PARTS = "stage2_features,stage2_refiner,stage2_pass"
_KNOWN_STAGE2 = {"stage2_features,stage2_refiner", STAGE2_PARTS}
NMS_PART = "nms_paired_area"  # metadata "nms" (format v3, CPU): the NMS's overlap clipping (PackagePairedArea)
# metadata "stage2_large" (format v4, CPU, models with refine_large): refine_large's whole pass (its RefinePass),
# with its settings under the "stage2_large_" keys as the first refiner's under "stage2_"
STAGE2_LARGE_PART = "stage2_large_pass"


class PackageStage2:
    """Stage 2's costly parts from the package (what `CompiledRefiner` is on the torch.compile path): ``features`` as
    `sampled_features`, run compiled when the call is one the package was compiled for (its sampled count, margin
    and intensity scale; 2 to ``rois`` boxes), else eagerly; ``refiner`` for exactly ``rois`` candidates; and, from
    format v3, ``refine_pass``: a whole refinement pass (`RefinePass`) for ``rois`` candidates, one compiled call."""

    def __init__(self, features, refiner, meta: dict[str, str], refine_pass=None, prefix: str = "stage2") -> None:
        self._features, self._refiner, self._pass = features, refiner, refine_pass
        self.rois = int(meta[f"{prefix}_rois"])
        self._fixed = (int(meta[f"{prefix}_points"]), float(meta[f"{prefix}_margin"]),
                       float(meta[f"{prefix}_intensity_scale"]))

    def features(self, points, near, boxes, k, margin, intensity_scale):
        from livox_infer.detector.refine import sampled_features

        if self._features is None or (k, float(margin), float(intensity_scale)) != self._fixed \
                or not 2 <= boxes.shape[0] <= self.rois or points.shape[0] < k:
            return sampled_features(points, near, boxes, k, margin, intensity_scale)
        try:
            return tuple(self._features(points.contiguous(), near.contiguous(), boxes.contiguous()))
        except Exception as exc:  # noqa: BLE001 - a compiled part that fails once would fail every frame: eager
            self._features = None
            log.warning("stage 2's compiled point features failed (%s: %s); they run eagerly from now on",
                        type(exc).__name__, exc)
            return sampled_features(points, near, boxes, k, margin, intensity_scale)

    eager_refiner = None  # the weights file's refiner (the pipeline sets it), for a compiled refiner that fails

    def refiner(self, feats, valid, context):
        if self._refiner is not None:
            try:
                return tuple(self._refiner(feats.contiguous(), valid.contiguous(), context.contiguous()))
            except Exception as exc:  # noqa: BLE001 - as for the features: eager from now on
                if self.eager_refiner is None:
                    raise
                self._refiner = None
                log.warning("stage 2's compiled refiner failed (%s: %s); it runs eagerly from now on",
                            type(exc).__name__, exc)
        return self.eager_refiner(feats, valid, context)

    def refine_pass(self, points, near, boxes, scores, labels, hits, intensity_scale):
        """(scores, boxes) of one whole pass (`RefinePass`), or None where the package has no such part or was not
        compiled for this call (the caller then runs the pass from its parts)."""
        if self._pass is None or float(intensity_scale) != self._fixed[2] or boxes.shape[0] != self.rois \
                or points.shape[0] < self._fixed[0]:
            return None
        args = [points, near, boxes, scores, labels] + ([] if hits is None else list(hits))
        try:
            return tuple(self._pass(*(a.contiguous() for a in args)))
        except Exception as exc:  # noqa: BLE001 - as for the features: from its parts from now on
            self._pass = None
            log.warning("stage 2's compiled pass failed (%s: %s); it runs from its parts from now on",
                        type(exc).__name__, exc)
            return None


class PackagePairedArea:
    """The NMS's overlap clipping (`boxes._paired_intersection_area`, float64 corner sets (P, 4, 2)) from the
    package for two pairs or more, else (and after a failure, with one warning) eagerly."""

    def __init__(self, part) -> None:
        self._part = part

    def __call__(self, ca: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        from livox_infer.detector.boxes import _paired_intersection_area

        if self._part is not None and ca.shape[0] >= 2 and ca.dtype == torch.float64:
            try:
                return self._part(ca.contiguous(), cb.contiguous())
            except Exception as exc:  # noqa: BLE001 - as PackageStage2's parts: eager from now on
                self._part = None
                log.warning("the NMS's compiled part failed (%s: %s); it runs eagerly from now on",
                            type(exc).__name__, exc)
        return _paired_intersection_area(ca, cb)


# --------------------------------------------------------------------------- packages built for this machine
# What a package in the cache (livox_infer.cache.packages_dir) must match to be picked without being named: the
# fields below, in the order a mismatch is reported. ``machine`` is the CPU architecture and the vector ISA torch
# dispatches to (a package holds kernels compiled for it); ``threads`` the intra-op count baked into the kernels.
MATCH_FIELDS = ("format", "config_name", "bev_extent", "architecture_hash", "weights_sha256", "test_time_flip",
                "precision", "device_type", "machine", "threads", "torch_version")
_FIELD_WORDS = {"format": "package format", "config_name": "model", "architecture_hash": "architecture",
                "bev_extent": "grid (bev_extent)", "weights_sha256": "weights (sha256)",
                "test_time_flip": "test_time_flip", "precision": "precision", "device_type": "device", "machine": "CPU",
                "threads": "threads", "torch_version": "torch version"}


def machine_tag(device: torch.device) -> str:
    """What the package's kernels were compiled for: CPU architecture + vector ISA, or the GPU."""
    import platform

    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def package_fields(cfg: ModelConfig, weights: str | Path, device: torch.device, flip: bool, precision: str = "fp32",
                   weights_sha256: str | None = None) -> dict[str, str]:
    """The MATCH_FIELDS of a package of ``cfg`` + ``weights`` for ``device`` on this machine, now; ``precision`` a
    resolved one (fp32 | bf16, `livox_infer.detector.precision`)."""
    return {
        "format": PACKAGE_FORMAT,
        "config_name": cfg.name,
        "architecture_hash": cfg.architecture_hash(),
        "bev_extent": extent_text(cfg),
        "weights_sha256": weights_sha256 or file_sha256(weights),
        "test_time_flip": "yes" if flip else "no",
        "precision": precision,
        "device_type": device.type,
        "machine": machine_tag(device),
        "threads": str(torch.get_num_threads()) if device.type == "cpu" else "-",
        "torch_version": torch.__version__,
    }


def package_name(fields: dict[str, str]) -> str:
    """The file name of the package with these fields in the packages folder."""
    key = hashlib.sha256(json.dumps([fields[k] for k in MATCH_FIELDS]).encode()).hexdigest()[:12]
    return f"{fields['config_name']}.{fields['device_type']}.{key}.pt2"


def find_package(fields: dict[str, str], folder: Path | None = None) -> tuple[Path | None, str]:
    """(the package in ``folder`` (default: the cache's) built for exactly ``fields``, "") or (None, why not: the
    closest package's first differing field, or that there is none)."""
    from livox_infer.cache import packages_dir

    folder = folder or packages_dir()
    path = folder / package_name(fields)
    if path.is_file() and path.with_suffix(".json").is_file():
        return path, ""
    best: tuple[int, str] | None = None
    for side in sorted(folder.glob("*.json")):
        try:
            other = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(other, dict):
            continue
        differ = [k for k in MATCH_FIELDS if str(other.get(k)) != fields[k]]
        if other.get("config_name") != fields["config_name"] or not differ:
            continue
        k = differ[0]
        why = (f"the closest, {side.with_suffix('.pt2').name}, differs in {_FIELD_WORDS[k]}: "
               f"{other.get(k)} there, {fields[k]} here")
        if best is None or len(differ) < best[0]:
            best = (len(differ), why)
    if best is None:
        return None, f"no AOTInductor package for model {fields['config_name']} in {folder} (`make package` builds them)"
    return None, f"no matching AOTInductor package in {folder}: {best[1]}"


@contextlib.contextmanager
def _private_tmpdir():
    """A fresh private directory that is also $TMPDIR while the block runs (torch extracts a package under
    $TMPDIR/aotinductor_*), removed with everything in it afterwards, also when loading failed."""
    root = tempfile.mkdtemp(prefix="livox_infer_aoti_")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = root
    try:
        yield Path(root)
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
        shutil.rmtree(root, ignore_errors=True)


class AotiRunner:
    """A loaded package, callable like the InferenceModel: (1, C, H, W) -> (scores, labels, boxes)."""

    def __init__(self, path: str | Path, cfg: ModelConfig, device: torch.device, flip: bool = False,
                 precision: str | None = None) -> None:
        path = Path(path)
        data = trusted_bytes(path)  # before any native code of it is loaded
        with _private_tmpdir() as private:
            copy = private / "package.pt2"  # the checked bytes, out of reach of whoever wrote `path`
            copy.write_bytes(data)
            try:
                self._model = _load_package(str(copy))
                meta = dict(self._model.get_metadata())
            except Exception as exc:  # noqa: BLE001 - a foreign/corrupt zip, wrong platform, missing symbols
                raise WeightsError(f"{path} is not a loadable AOTInductor package: {type(exc).__name__}: {exc}") from exc
            _check_metadata(meta, path, cfg, device, flip, precision)
            with torch.no_grad():  # one call while the extracted files exist: GPU kernel files load at first use
                self._model(torch.zeros((1, *cfg.grid.shape), device=device).contiguous(memory_format=torch.channels_last))
            self.stage2 = None  # PackageStage2 when the package holds stage 2's parts (CPU packages since 2026-12-05)
            if meta.get("stage2") in _KNOWN_STAGE2 and cfg.refine is not None:
                try:
                    parts = {name: _load_package(str(copy), name) for name in meta["stage2"].split(",")}
                    self.stage2 = PackageStage2(parts["stage2_features"], parts["stage2_refiner"], meta,
                                                parts.get("stage2_pass"))
                except Exception as exc:  # noqa: BLE001 - stage 2 then runs eagerly, as from an older package
                    log.warning("%s: stage 2's compiled parts did not load (%s: %s); stage 2 runs eagerly", path,
                                type(exc).__name__, exc)
            self.stage2_large = None  # PackageStage2 (its pass alone) of refine_large, from a format-v4 CPU package
            if meta.get("stage2_large") == STAGE2_LARGE_PART and cfg.refine_large is not None:
                try:
                    self.stage2_large = PackageStage2(None, None, meta, _load_package(str(copy), STAGE2_LARGE_PART),
                                                      prefix="stage2_large")
                except Exception as exc:  # noqa: BLE001 - refine_large then runs eagerly
                    log.warning("%s: refine_large's compiled pass did not load (%s: %s); it runs eagerly", path,
                                type(exc).__name__, exc)
            self.paired_area = None  # PackagePairedArea when the package holds the NMS's part (CPU, format v3)
            if meta.get("nms") == NMS_PART:
                try:
                    self.paired_area = PackagePairedArea(_load_package(str(copy), NMS_PART))
                except Exception as exc:  # noqa: BLE001 - the NMS then clips eagerly
                    log.warning("%s: the NMS's compiled part did not load (%s: %s); it runs eagerly", path,
                                type(exc).__name__, exc)
        self.path = path
        self.metadata = meta

    def __call__(self, bev: torch.Tensor):
        return tuple(self._model(bev))


# --------------------------------------------------------------------------- CLI
