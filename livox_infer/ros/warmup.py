"""What the detector node says while it starts: building the pipeline takes seconds (eager) to a minute
(torch.compile on a CPU without a warm cache), and a silent node without topics looks dead. The node
advertises its topics first, then builds the pipeline inside :func:`warming_up`, which logs what is being done
and publishes a "warming up" diagnostics status every diagnostics period until the pipeline is ready."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

PROGRESS_LOG_PERIOD_S = 15.0


def compile_cache_state() -> tuple[Path, bool]:
    """(torch.compile's cache directory, whether it already holds compiled kernels)."""
    from livox_infer.cache import inductor_cache_dir

    cache = inductor_cache_dir()
    warm = cache.is_dir() and any(True for _ in cache.iterdir())
    return cache, warm


def describe_start(values: dict[str, Any]) -> str:
    """One line on how the pipeline is about to be built (what the first seconds or minute are spent on)."""
    what = f"model {values['model']} on device {values['device']}"
    if values["aoti_package"]:
        return f"loading {what} from the AOTInductor package {values['aoti_package']} (compiled ahead of time)"
    if not values["use_compile"]:
        return f"building {what}, eager (use_compile false: no compile step)"
    from livox_infer.cache import packages_dir

    if values.get("build_package", True):
        return (f"building {what}: the AOTInductor package built for this machine if one in {packages_dir()} "
                "matches, else eager at once while that package is built in the background (build_package)")
    cache, warm = compile_cache_state()
    package = f"the AOTInductor package built for this machine if one in {packages_dir()} matches, else torch.compile"
    if values.get("compile_in_background", True) and values["device"] != "cuda":
        return (f"building {what}: {package} in a background thread, eager at once until it is ready "
                f"(compile_in_background; {'warm' if warm else 'no warm'} compile cache in {cache})")
    if warm:
        return (f"building {what}: {package}; warm compile cache found in {cache} (when it holds this "
                f"model's kernels: seconds, not a minute)")
    return (f"building {what}: {package}; no warm compile cache in {cache}: the first compile takes about "
            f"a minute on a CPU (later starts reuse it; `make package` or use_compile:=false start at once)")


@contextmanager
def warming_up(logger, publish_status: Callable[[float], None], period_s: float,
               summary: Callable[[], str] | None = None) -> Iterator[None]:
    """Run the body (the pipeline build) while a thread calls ``publish_status(elapsed_s)`` every ``period_s`` and
    logs progress every PROGRESS_LOG_PERIOD_S; then one line: how long it took and ``summary()`` (the phases)."""
    done = threading.Event()
    started = time.monotonic()

    def heartbeat() -> None:
        last_log = started
        while not done.wait(period_s):
            now = time.monotonic()
            publish_status(now - started)
            if now - last_log >= PROGRESS_LOG_PERIOD_S:
                logger.info(f"still building the pipeline ({now - started:.0f} s)")
                last_log = now

    publish_status(0.0)
    thread = threading.Thread(target=heartbeat, name="livox_detector_warmup", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=period_s + 1.0)
    phases = summary() if summary is not None else ""
    logger.info(f"pipeline ready after {time.monotonic() - started:.1f} s" + (f" ({phases})" if phases else ""))

