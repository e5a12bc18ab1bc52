"""The in-process context store's memory (issue #29 finding 5): what it really holds stays
within what ``proxy.memory_budget`` counts for it."""

from __future__ import annotations

import gc
import tracemalloc

import orjson

from proxy.context.store import MEMORY_ENTRY_OVERHEAD_BYTES, MemoryContextStore


async def test_what_the_store_holds_is_its_counted_bytes_plus_a_fixed_cost_per_entry() -> None:
    """Values were kept as orjson returned them: a 30-byte cached answer held a 4 KiB buffer the
    bound never saw. Values are kept right-sized, and each entry's bookkeeping (key, indexes) is
    within ``MEMORY_ENTRY_OVERHEAD_BYTES``."""
    store = MemoryContextStore(max_bytes=1 << 40, max_entries=1 << 40)
    entries = 3000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(entries):
            key = f"cogproxy:ctx:{n % 3:016x}:cache:code-reviewer:{n:064x}:{n:032x}"
            await store.put(key, orjson.dumps({"ok": True, "n": n}), 60)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.size_bytes + entries * MEMORY_ENTRY_OVERHEAD_BYTES
    assert held <= counted, f"{held} bytes held, {counted} counted"
