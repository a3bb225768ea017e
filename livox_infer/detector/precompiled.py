"""torch.compile's result kept for the next start: torch's AOT precompile (`aot_compile` + `save_compiled_function`).

With every inductor cache warm a restart still traced the network with dynamo and probed the CPU's vector ISA
(g++ and one child process per ISA): ~10 s of a 13 s node start on 2 cores (issue 33). A saved compiled function
holds dynamo's bytecode and guards and inductor's kernels, not the weights (the module is handed in at load), so a
restart loads it in ~1.5 s and runs the same kernels.

A file is reused only when it matches all of:
- the package match fields (`livox_infer.detector.aoti.package_fields`: config, grid, weights' sha256, precision,
  CPU, threads, torch version) with this format, and the Python version;
- the sha256 of every source module dynamo traced (a code change re-traces);
- its own sha256, recorded in the trusted-package manifest when it was written (a saved function is code: a
  pickle and shared libraries, trusted like an AOTInductor package, `livox_infer.detector.aoti`).
Anything else, and any failure to load or a failed guard, compiles as before (and saves for the next start).
Files live in ``<cache>/precompiled`` (`livox_infer.cache.precompiled_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("livox_infer.precompiled")
PRECOMPILED_FORMAT = "livox_infer.precompiled.v1"


def _module_sha256(name: str) -> str | None:
    from livox_infer.detector.aoti import file_sha256

    module = sys.modules.get(name)
    try:
        path = inspect.getsourcefile(module) if module is not None else None
        return file_sha256(path) if path else None
    except (OSError, TypeError):
        return None


def _traced_sources(compiled: Any) -> dict[str, str | None]:
    """{module: sha256 of its source file} of every module whose code dynamo traced into ``compiled``."""
    names = {s.module for s in compiled.source_info().inlined_sources}
    return {name: _module_sha256(name) for name in sorted(names)}


def _vec_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())


@contextlib.contextmanager
def _known_vec_isa(recorded: str):
    """Skip inductor's vector-ISA probe (it builds and dlopens a test library per ISA in child processes, ~1.5-2.5 s)
    when the file was saved on this machine after that probe passed: the CPU and its ISA are match fields. The list it
    yields is then cached for this process, so it is checked against the recorded pick; on a difference the probe's
    cache is cleared and the load refused."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    try:
        with config.patch({"cpp.vec_isa_ok": True}):
            yield
            if _vec_isa() != recorded:
                raise RuntimeError(f"vector ISA {_vec_isa()} here, {recorded} when saved")
    except BaseException:
        valid_vec_isa_list.cache_clear()
        raise


MAX_VARIANTS = 8  # per part, as dynamo's recompile limit: inputs outside all of them run a plain torch.compile


class SavedCompile:
    """``fn`` (a function, or a module whose forward is compiled) compiled for the inputs seen so far: one compiled
    function (variant) per set of guards, as dynamo recompiles for inputs outside a graph's guards (a stage-2 call
    with one box, say). Variants load from and save to ``<stem>.<i>.bin`` / ``.json``, so the next start has them
    all; past MAX_VARIANTS a plain torch.compile of ``fn`` takes the rest."""

    def __init__(self, fn: Callable, stem: Path, fields: dict[str, str], dynamic: bool) -> None:
        self._fn = fn
        self._module = fn if isinstance(fn, torch.nn.Module) else None
        self._target = fn.forward if self._module is not None else fn
        self._f_globals = vars(sys.modules[type(fn).__module__ if self._module is not None else fn.__module__])
        self._external = {"module": self._module} if self._module is not None else {}
        self._stem, self._fields, self._dynamic = stem, fields, dynamic
        self.variants: list[Any] = []
        self.loaded = 0  # how many variants came from files
        self.why_not_loaded = ""  # why the first variant was not loaded, when it was not
        self.not_saved = ""  # why the last new variant could not be saved, when it could not
        self._fallback: Callable | None = None
        while len(self.variants) < MAX_VARIANTS:
            got = _load(self._variant_stem(len(self.variants)), fields, self._f_globals, self._external)
            if isinstance(got, str):
                self.why_not_loaded = got if not self.variants else ""
                break
            got.disable_guard_check()  # checked in __call__, so a miss can compile a variant instead of raising
            self.variants.append(got)
        self.loaded = len(self.variants)

    def _variant_stem(self, i: int) -> Path:
        return self._stem.with_name(f"{self._stem.name}.{i}")

    def __call__(self, *args: Any) -> Any:
        full = (self._module, *args) if self._module is not None else args
        for compiled in self.variants:
            if compiled.guard_check(*full):
                return compiled(*full)
        if self._fallback is not None:
            return self._fallback(*args)
        return self._new_variant(args, full)

    def _new_variant(self, args: tuple, full: tuple) -> Any:
        if len(self.variants) >= MAX_VARIANTS:
            log.info("%s: inputs outside its %d saved variants: plain torch.compile from now on", self._stem.name,
                     len(self.variants))
            self._fallback = torch.compile(self._fn, dynamic=self._dynamic, fullgraph=True)
            return self._fallback(*args)
        try:
            compiled = torch.compile(self._target, dynamic=self._dynamic, fullgraph=True).aot_compile((args, {}))
        except Exception as exc:  # noqa: BLE001 - precompile is torch-experimental: plain torch.compile instead
            self.not_saved = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self._fallback = torch.compile(self._fn, dynamic=self._dynamic, fullgraph=True)
            return self._fallback(*args)
        compiled.disable_guard_check()
        self.variants.append(compiled)
        try:
            _save(compiled, self._variant_stem(len(self.variants) - 1), self._fields, self._external)
        except Exception as exc:  # noqa: BLE001 - an unwritable cache or an unpicklable graph: it still runs
            self.not_saved = f"{type(exc).__name__}: {exc}"
        return compiled(*full)


def file_stem(fields: dict[str, str], part: str) -> str:
    from livox_infer.detector.aoti import MATCH_FIELDS

    key = hashlib.sha256(json.dumps([part, fields.get("python", ""), *(fields[k] for k in MATCH_FIELDS)]).encode()
                         ).hexdigest()[:12]
    return f"{fields['config_name']}.{part}.{key}"


def compile_saved(fn: Callable, example_args: tuple, part: str, fields: dict[str, str], *, dynamic: bool = False,
                  folder: Path | None = None) -> tuple[SavedCompile, str]:
    """(the compiled ``fn``, run once on ``example_args``; how: "loaded" | "compiled and saved (why the saved one was
    not used)" | "compiled (not saved: why)"). ``fn``: a function or an nn.Module; ``part``: its name in the file
    names (network, stage2_features, ...); ``fields``: `aoti.package_fields` of the network it belongs to."""
    from livox_infer.cache import precompiled_dir

    # dynamo's bytecode belongs to one Python version: two of them sharing the cache keep a file each
    fields = {**fields, "format": PRECOMPILED_FORMAT, "python": platform.python_version()}
    saved = SavedCompile(fn, (folder or precompiled_dir()) / file_stem(fields, part), fields, dynamic)
    saved(*example_args)
    if saved.not_saved:
        return saved, f"compiled (not saved: {saved.not_saved})"
    if len(saved.variants) == saved.loaded:
        return saved, "loaded" if saved.loaded == 1 else f"loaded ({saved.loaded} variants)"
    return saved, f"compiled and saved (the saved one: {saved.why_not_loaded or 'other inputs'})"


def _path(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)


def _save(compiled: Any, stem: Path, fields: dict[str, str], external: dict[str, Any]) -> None:
    from livox_infer.detector.aoti import record_in_manifest

    stem.parent.mkdir(parents=True, exist_ok=True)
    side = {**fields, "sources": _traced_sources(compiled), "vec_isa": _vec_isa() if fields["device_type"] == "cpu" else ""}
    tmp = _path(stem, f".{os.getpid()}.tmp")  # another process may write the same variant: each its own file
    compiled.save_compiled_function(str(tmp), external_data=external)
    tmp.replace(_path(stem, ".bin"))
    record_in_manifest(_path(stem, ".bin"), {k: str(v) for k, v in fields.items()})
    tmp.write_text(json.dumps(side, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(_path(stem, ".json"))


def _load(stem: Path, fields: dict[str, str], f_globals: dict, external: dict[str, Any]) -> Any:
    """The saved compiled function, or why not (a string)."""
    from livox_infer.detector.aoti import trusted_bytes
    from livox_infer.errors import WeightsError

    try:
        side = json.loads(_path(stem, ".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "none saved"
    if not _path(stem, ".bin").is_file():
        return "none saved"
    if not isinstance(side, dict) or any(str(side.get(k)) != v for k, v in fields.items()):
        return "saved for other settings"
    sources = side.get("sources") or {}
    changed = [name for name, digest in sources.items() if _module_sha256(name) != digest]
    if changed or not sources:
        return f"source changed since saved ({', '.join(changed) or 'no sources recorded'})"
    try:
        data = trusted_bytes(_path(stem, ".bin"))  # the same check as a package's, on the bytes then loaded
    except WeightsError:
        return "not in the trusted-package manifest"
    isa = _known_vec_isa(side["vec_isa"]) if side.get("vec_isa") else contextlib.nullcontext()
    try:
        with isa:
            return torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals, external_data=external)
    except Exception as exc:  # noqa: BLE001 - whatever stops it (another torch's format, a missing kernel): compile
        return f"did not load ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
