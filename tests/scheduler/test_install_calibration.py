"""The conductor installs what workers measured at start, and live refits win over it."""

import pytest

from scheduler.conductor import PREFILL_FIRST_REFIT, PREFILL_REFIT, Conductor
from scheduler.config import SchedulerConfig
from scheduler.cpp import CppPrefillTimeModel
from scheduler.predictors import PrefillTimeModel


def test_a_calibration_replaces_the_configured_figures():
    conductor = Conductor(SchedulerConfig())
    conductor.install_calibration(bytes_per_token=2048, bandwidth=4e9, prefill_coef=(0.001, 5e-5, 1e-8))
    conductor.install_calibration(bytes_per_token=2048, tbt_coef=(0.004, 0.002, 3e-6))
    figures = conductor.cost_figures()
    assert figures["kv_bytes_per_token"] == 2048 and figures["transfer_bandwidth"] == 4e9
    assert figures["prefill_coef"] == [0.001, 5e-5, 1e-8] and figures["tbt_coef"] == [0.004, 0.002, 3e-6]
    # The transfer model plans with them: 1000 tokens of 2 KiB at 4 GB/s, plus its latency.
    assert conductor.transfer_model.predict(1000) == pytest.approx(0.001 + 1000 * 2048 / 4e9)
    assert conductor.prefill_model.predict(1000, 0) == pytest.approx(0.001 + 0.05 + 0.005)


def test_the_slowest_measured_pull_is_what_transfers_are_planned_at():
    conductor = Conductor(SchedulerConfig())
    for bandwidth in (8e9, 1e8, 3e9):  # three prefill workers: one pulls over a slow link
        conductor.install_calibration(bytes_per_token=2048, bandwidth=bandwidth)
    assert conductor.cost_figures()["transfer_bandwidth"] == 1e8
    # The auto threshold keeps learning from the new line.
    assert conductor.transfer_model.learn


def test_a_group_follows_the_installed_prefill_model():
    conductor = Conductor(SchedulerConfig())
    conductor.add_prefill("group", conductor.group_model(2, 1024))
    conductor.install_calibration(prefill_coef=(0.0, 1e-5, 0.0))
    model = conductor.prefill["group"].model
    assert isinstance(model, CppPrefillTimeModel) and model.single.coef == (0.0, 1e-5, 0.0)


def test_a_live_refit_is_not_replaced_by_a_later_workers_profile():
    conductor = Conductor(SchedulerConfig())
    conductor.add_prefill("p0")
    conductor.install_calibration(prefill_coef=(0.001, 5e-5, 1e-8), tbt_coef=(0.004, 0.002, 3e-6))
    for i in range(PREFILL_REFIT):
        n, p = 200 + 37 * (i % 9), 32 * (i % 4)
        conductor.observe_prefill(n, p, 0.002 + 1e-4 * (n - p))
    refitted = conductor.prefill_model.coef
    assert refitted == pytest.approx((0.002, 1e-4, 0.0), abs=1e-9)
    conductor.install_calibration(bytes_per_token=4096, prefill_coef=(0.5, 0.5, 0.5))  # a worker joining late
    assert conductor.prefill_model.coef == refitted
    assert conductor.cost_figures()["kv_bytes_per_token"] == 4096


def test_a_handful_of_served_samples_move_the_plan_off_the_start_up_profile():
    # The profile times a bare forward pass; the served path takes twice as long per token and
    # 10 ms more per job (layers sent and stored as computed, cores shared). Within a handful of
    # requests the plan must follow the served costs, not wait for PREFILL_REFIT of them.
    conductor = Conductor(SchedulerConfig())
    conductor.add_prefill("p0")
    profile = (0.0015, 3.2e-5, 8e-8)
    conductor.install_calibration(prefill_coef=profile)
    served = PrefillTimeModel((0.0115, 6.4e-5, 1.6e-7))
    shapes = [(320, 0), (832, 512), (1024, 0), (576, 448), (704, 192), (960, 768), (448, 0), (640, 128)]
    for n, p in shapes:
        conductor.observe_prefill(n, p, served.predict(n, p))
    assert len(shapes) == PREFILL_FIRST_REFIT and conductor.prefill_model.coef != profile
    # The profile still counts as a few samples, so the plan is near, not at, the served costs.
    for n, p in shapes:
        assert conductor.prefill_model.predict(n, p) == pytest.approx(served.predict(n, p), rel=0.05)
