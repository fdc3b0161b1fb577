"""The conductor's book of one prefill instance: how long a job enqueued now would wait."""

import pytest

from scheduler.instances import PrefillQueue


def queue_of(*jobs: tuple[str, float]) -> PrefillQueue:
    queue = PrefillQueue("P")
    for request_id, seconds in jobs:
        queue.enqueue(request_id, seconds, now=0.0)
    return queue


def test_a_head_within_its_prediction_leaves_the_rest_of_it():
    queue = queue_of(("head", 1.0), ("next", 2.0))
    assert queue.queue_time(0.25) == pytest.approx(0.75 + 2.0)


def test_a_head_that_overran_its_prediction_is_still_running():
    # Predicted 1 s, still running at 3 s: it is slower than planned and not done. Counted as
    # finishing now, the instance would look 2 s from free while its head may run on.
    queue = queue_of(("head", 1.0), ("next", 2.0))
    assert queue.queue_time(3.0) == pytest.approx(2.0 + 2.0)  # as long again as it overran
    assert queue.queue_time(5.0) > queue.queue_time(3.0)  # the longer it runs, the longer it may


def test_the_next_job_starts_when_the_head_reports():
    queue = queue_of(("head", 1.0), ("next", 2.0))
    queue.finish("head", now=3.0)
    assert queue.queue_time(3.5) == pytest.approx(1.5)
    queue.finish("next", now=4.0)
    assert queue.queue_time(4.0) == 0.0 and queue.num_queued == 0
