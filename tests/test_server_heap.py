"""``settle_heap``: after start-up the collector runs less often and skips the start-up heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from proxy.server import GC_THRESHOLDS, settle_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_settle_heap_freezes_what_start_up_allocated_and_raises_the_thresholds() -> None:
    settle_heap()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0  # the permanent generation holds the start-up objects
    assert all(count == 0 for count in gc.get_count()[1:])  # collected before freezing
