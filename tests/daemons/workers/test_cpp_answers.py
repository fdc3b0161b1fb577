"""How a CPP group waits for its stages' answers to a job round (no stage processes: pipes and
stand-in processes): an answer in time passes through, a late one fails the job only once it
came, and a stage whose process is gone fails it at once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing import Pipe

import pytest

from daemons.workers.cpp import group
from daemons.workers.cpp.group import answers_of


@dataclass
class StandInProcess:
    alive: bool = True
    exitcode: int | None = None
    name: str = "cpp-stage-0"

    def is_alive(self) -> bool:
        return self.alive


@pytest.fixture(autouse=True)
def quick_liveness_checks(monkeypatch):
    monkeypatch.setattr(group, "LIVENESS_POLL_S", 0.01)


def test_answers_in_time_pass_through():
    ours, stage = Pipe()
    stage.send({"ok": True, "loaded": 3})
    assert answers_of([(ours, StandInProcess())], time.monotonic() + 60) == [{"ok": True, "loaded": 3}]


def test_an_answer_after_the_deadline_fails_the_job():
    ours, stage = Pipe()
    stage.send({"ok": True, "loaded": 3})  # there, but only looked at after the deadline
    assert answers_of([(ours, StandInProcess())], time.monotonic() - 1) == [
        {"ok": False, "error": "answered after the job's timeout"}]


def test_a_gone_stage_fails_at_once_and_the_others_are_still_read():
    gone, _ = Pipe()  # never answers; its process exited
    ours, stage = Pipe()
    stage.send({"ok": True, "loaded": 1})
    answers = answers_of([(gone, StandInProcess(alive=False, exitcode=-9)), (ours, StandInProcess())],
                         time.monotonic() + 60)
    assert answers == [{"ok": False, "error": "exited (code -9)"}, {"ok": True, "loaded": 1}]
