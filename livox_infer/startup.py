"""Start-up phases with their timings (weights, package lookup, AOTInductor package, compile), whether torch.compile
found its compiled graphs in the inductor cache (a cold start compiles everything, a warm one re-traces the model and
loads the rest), and one note on which network runs and why (the package built for this machine, or why not).
"bypassed" means inductor could not cache the graph at all; the pipeline's own compile no longer does that
(docs/performance.md, Start-up)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# torch's counters of its on-disk caches (FX graph = inductor output, AOT autograd = traced graph)
_CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit", "hits"), ("inductor", "fxgraph_cache_miss", "misses"),
                   ("inductor", "fxgraph_cache_bypass", "bypasses"))


class StartupLog:
    """Seconds per phase, in order, and the inductor cache outcome of the compile phase."""

    def __init__(self) -> None:
        self.phases_s: dict[str, float] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_bypasses = 0
        self.notes: list[str] = []  # e.g. which network runs and why (the pipeline's package lookup)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases_s[name] = self.phases_s.get(name, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def inductor_cache(self) -> Iterator[None]:
        """Count the cache hits and misses of the torch.compile calls inside the block."""
        before = _cache_counts()
        try:
            yield
        finally:
            after = _cache_counts()
            self.cache_hits += after["hits"] - before["hits"]
            self.cache_misses += after["misses"] - before["misses"]
            self.cache_bypasses += after["bypasses"] - before["bypasses"]

    @property
    def cache_state(self) -> str:
        """warm (every graph from the cache), cold (none), partial, bypassed (not cacheable), or '' when
        nothing was compiled."""
        if not self.cache_hits and not self.cache_misses:
            return "bypassed" if self.cache_bypasses else ""
        return "warm" if not self.cache_misses else "cold" if not self.cache_hits else "partial"

    def summary(self) -> str:
        parts = [f"{name} {s:.1f} s" for name, s in self.phases_s.items()]
        if self.cache_state == "bypassed":
            parts.append(f"inductor graph cache bypassed ({self.cache_bypasses} graphs; C++ kernels cached)")
        elif self.cache_state:
            parts.append(f"inductor cache {self.cache_state} ({self.cache_hits} hits, {self.cache_misses} misses)")
        parts.extend(self.notes)
        return ", ".join(parts) if parts else "nothing timed"


def _cache_counts() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # torch without dynamo: nothing to count
        return {"hits": 0, "misses": 0, "bypasses": 0}
    out = {"hits": 0, "misses": 0, "bypasses": 0}
    for group, key, kind in _CACHE_COUNTERS:
        out[kind] += int(counters[group][key])
    return out
