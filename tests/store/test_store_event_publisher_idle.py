"""The KV-event publisher sleeps while nothing happens and still sends the first event at once.

It sends what piled up every few milliseconds while events flow; after a quiet interval its
thread sleeps until the first new event rings its doorbell, a replay request comes, or the
publisher closes. These tests would fail if the thread kept its cadence while idle (its context
switches), or if a sleeping thread missed an event, a replay request or close().
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import zmq

from store.events.messages import BlockStored, KVEventBatch
from store.events.publisher import KvEventPublisher
from store.events.recorder import STORED, StoreEvent


def context_switches(thread: threading.Thread) -> int:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)


def publisher_thread() -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == "kv-events"]
    return thread


def test_an_idle_publisher_sleeps_and_wakes_for_an_event_and_a_replay():
    publisher = KvEventPublisher("127.0.0.1")
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.address)
    replay = context.socket(zmq.REQ)
    replay.connect(publisher.replay_address)
    try:
        thread = publisher_thread()
        time.sleep(0.1)  # well past one send interval: the thread is asleep now
        before = context_switches(thread)
        time.sleep(0.5)  # a 5 ms cadence would switch about 100 times here
        assert context_switches(thread) - before < 10
        # A SUB joins late (ZeroMQ's slow joiner): publish until one batch gets through; each
        # publish comes after a quiet interval, so each is woken by the doorbell.
        for key in range(50):
            publisher.publish([StoreEvent(STORED, f"k{key}", "seg")])
            if sub.poll(200):
                break
        _, sequence, payload = sub.recv_multipart()
        assert KVEventBatch.decode(payload).events[0] == BlockStored([f"k{key}".encode()], "seg")
        time.sleep(0.1)
        replay.send((0).to_bytes(8, "big"))  # to the sleeping thread
        assert replay.poll(2000), "a sleeping publisher did not answer a replay request"
        first = replay.recv_multipart()
        assert int.from_bytes(first[0], "big") == 0
    finally:
        sub.close(linger=0)
        replay.close(linger=0)
        closed_at = time.monotonic()
        publisher.close()
    assert not thread.is_alive() and time.monotonic() - closed_at < 2.0
