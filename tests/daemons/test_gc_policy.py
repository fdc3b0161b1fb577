"""Each daemon's cycle collector: young passes every gc_threshold allocations, full ones rare."""

from __future__ import annotations

import gc

import pytest

from daemons.base import tune_collector
from transfer.settings import resolve


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_setting_sets_the_collectors_thresholds(thresholds):
    tune_collector(resolve({"gc_threshold": "12345"}, environ={}).gc_threshold)
    assert gc.get_threshold() == (12345, 5, 1000)


def test_zero_leaves_the_interpreters_defaults(thresholds):
    gc.set_threshold(700, 10, 10)
    tune_collector(resolve({"gc_threshold": "0"}, environ={}).gc_threshold)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_default_holds_young_passes_well_above_the_interpreters():
    assert resolve({}, environ={}).gc_threshold >= 10_000
