"""How large a context to give a model: its trained context, capped by the memory it needs.

Each of the engine's contexts (chat and attach) holds a KV cache and llama.cpp's compute
buffer, and a restore or a capture holds copies of the KV beside them; the weights are mapped
once. Estimated from the GGUF header (`gguf_header`) as llama.cpp allocates them (measured with
llama-cpp-python 0.3.36: benchmarks/RESULTS.md, "Context size per model"):

    KV            f16, every position of the full-attention layers, plus a sliding-window
                  model's window cache (its window and a batch, rounded to 256 cells)
    compute       the larger of the logits of a 512-token batch (n_vocab x 512 x 4 bytes) and,
                  without flash attention, one layer's attention scores (heads x n_ctx x 512 x 4)
    copies        twice the KV (a restore's state buffer and a capture)

The default context is the largest of the trained context, halved down to 2,048 tokens, whose
estimate for both contexts and the weights fits in `MEMORY_SHARE` of the memory available now
(/proc/meminfo's MemAvailable, the room under the process's cgroup limits, or sysconf);
`choose` says which and why, and `kvdesk info` shows it. A context size the user sets is
theirs, unless llama.cpp could not even allocate it (`unallocatable`): then no process starts
one, rather than have the system end it for want of memory. It reads no model and allocates nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .gguf_header import HeaderFacts

MEMORY_SHARE = 0.6  # of the memory available: the rest stays the system's and the user's
CONTEXTS = 2  # chat and attach
FLOOR = 2048
FALLBACK = 8192  # when the header says nothing of the trained context
UBATCH = 512
CELL_ROUND = 256


@dataclass(frozen=True)
class ContextChoice:
    n_ctx: int
    why: str
    estimate_bytes: int | None = None  # both contexts and the weights, at n_ctx


def available_memory() -> int | None:
    """Bytes of memory available now (None: this system does not say)."""
    found = cgroup_room()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return max(0, min(found))


# (cgroup v2's files, and v1's memory controller's under its own mount: the limit, what is
# charged, and the file cache in that which the kernel gives back before it ends anything)
_V2 = ("", "memory.max", "memory.current", "inactive_file")
_V1 = ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def cgroup_room(root: Path = Path("/sys/fs/cgroup"),
                own: Path = Path("/proc/self/cgroup")) -> list[int]:
    """The room left under each memory limit on this process: its own cgroup's and every one
    above it, v2 or v1 (where `systemd-run -p MemoryMax=`, a desktop's app slice or a
    container puts one; the system's memory does not show it, and the kernel ends a process
    that passes it without a word)."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    found = []
    for line in lines or ["0::/"]:  # (none said: the hierarchy's root, as a container sees it)
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:
            mount, limit, used, freeable = _V2
        elif "memory" in controllers.split(","):
            mount, limit, used, freeable = _V1
        else:
            continue
        top = root / mount
        folder = top / path.strip("/")
        while True:
            try:
                said = (folder / limit).read_text().strip()
                if said != "max":
                    found.append(int(said) - int((folder / used).read_text())
                                 + _stat(folder / "memory.stat", freeable))
            except (OSError, ValueError):
                pass
            if folder == top or top not in folder.parents:
                break
            folder = folder.parent
    return found


def _stat(path: Path, key: str) -> int:
    """A cgroup's memory.stat value (0 where it is not said)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def estimate(facts: HeaderFacts, n_ctx: int, *, flash_attn: bool) -> int | None:
    """Bytes one context of n_ctx tokens needs beside the weights (None: not enough facts)."""
    found = parts(facts, n_ctx, flash_attn=flash_attn)
    if found is None:
        return None
    kv, compute = found
    return 3 * kv + compute


def parts(facts: HeaderFacts, n_ctx: int, *, flash_attn: bool) -> tuple[int, int] | None:
    """(KV cache bytes, compute buffer bytes) of one context as llama.cpp allocates them."""
    if facts.kv_bytes_per_token is None:
        return None
    kv = facts.kv_bytes_per_token * n_ctx
    if facts.sliding_window and facts.kv_window_bytes:
        cells = min(n_ctx, -(-(facts.sliding_window + UBATCH) // CELL_ROUND) * CELL_ROUND)
        kv += facts.kv_window_bytes * cells // facts.sliding_window
    compute = (facts.n_vocab or 0) * UBATCH * 4
    if not flash_attn and facts.n_head:
        compute = max(compute, facts.n_head * n_ctx * UBATCH * 4)
    return kv, compute


def choose(facts: HeaderFacts | None, *, model_bytes: int, flash_attn: bool,
           available: int | None) -> ContextChoice:
    """The context size to use, and why."""
    trained = facts.context_length if facts is not None and facts.context_length else None
    top = trained or FALLBACK
    source = (f"the model's trained context ({trained:,} tokens)" if trained
              else f"{FALLBACK:,} tokens (the header gives no trained context)")
    if facts is None or available is None or estimate(facts, top, flash_attn=flash_attn) is None:
        unknown = "the memory available is unknown" if available is None else \
            "the header does not give the KV cache's size"
        return ContextChoice(top, f"{source}; {unknown}, so not capped")
    budget = int(available * MEMORY_SHARE)

    def need(n: int) -> int:
        return model_bytes + CONTEXTS * estimate(facts, n, flash_attn=flash_attn)

    n = top
    while n > min(FLOOR, top) and need(n) > budget:
        n = max(min(FLOOR, top), n // 2 // CELL_ROUND * CELL_ROUND)
    gb = f"{need(n) / 1e9:.1f} GB for the weights and {CONTEXTS} contexts (KV, compute " \
         f"buffers, copies), of {available / 1e9:.1f} GB available"
    if n == top:
        return ContextChoice(n, f"{source}; it fits: {gb}", need(n))
    if need(n) > budget:
        return ContextChoice(n, f"{n:,} tokens, the smallest kvdesk gives a model: even this "
                                f"may not fit ({gb})", need(n))
    return ContextChoice(n, f"capped by memory below {source}: {gb}", need(n))


def unallocatable(facts: HeaderFacts | None, n_ctx: int, *, model_bytes: int, flash_attn: bool,
                  available: int | None) -> str | None:
    """Why a context of `n_ctx` tokens, set by the user, cannot be had here: the weights and
    both contexts' KV and compute buffers, as llama.cpp allocates them when the model loads,
    exceed the memory available (then the system ends the process with no word: a context
    of 1,048,576 tokens of SmolLM2 took 23.6 GB). None when they fit, or nothing says."""
    if facts is None or available is None or parts(facts, n_ctx, flash_attn=flash_attn) is None:
        return None

    def allocated(n: int) -> int:
        return model_bytes + CONTEXTS * sum(parts(facts, n, flash_attn=flash_attn))

    if allocated(n_ctx) <= available:
        return None
    # (what is suggested leaves the system its share, as the context chosen by default does)
    n, budget = n_ctx, available * MEMORY_SHARE
    while n > FLOOR and allocated(n) > budget:
        n = max(FLOOR, n // 2 // CELL_ROUND * CELL_ROUND)
    largest = (f"{n:,} tokens fit" if allocated(n) <= budget else
               f"not even {FLOOR:,} tokens fit well")
    return (f"a context of {n_ctx:,} tokens needs {allocated(n_ctx) / 1e9:.1f} GB for the weights "
            f"and {CONTEXTS} contexts' KV caches, and {available / 1e9:.1f} GB of memory is "
            f"available: {largest} (set a smaller n_ctx in the settings, --n-ctx or "
            "KVDESK_N_CTX, or leave it unset for the largest that fits)")
