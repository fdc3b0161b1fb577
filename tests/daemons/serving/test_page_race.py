"""A late prefill must never write into decode pages another request holds (issue 18's race).

A real cluster of 2 prefill workers and 1 decode worker of 256 pages (32 tokens each). A prefill
worker that is only slow - here stopped with SIGSTOP, as a loaded or swapping host would stall
it - misses its ``prefill.run`` call and its heartbeats, and the conductor gives it up. The pages
are laid out so that the request served next lands on the late request's pages if those are
freed while its prefill may still run:

    probe   reserved directly, never prefilled: page 0, until its reservation expires
    warm    a 40-token prompt, served: 2 pages, back at the end of the free list
    filler  streamed, 6030 tokens asked: 190 pages, cancelled once the late request failed, so
            its pages go back to the free list after whatever was freed before
    late    a 592-token prompt (its first block cached on the stalled worker, so it is sent
            there) and 1480 tokens asked: the last 65 free pages; its ``prefill.run`` waits
            in the stalled worker's socket
    victim  a 200-token prompt and 16 tokens: the late request's first 7 pages if they were
            freed - pages the late prefill writes - the filler's otherwise

The victim prefills on the other worker; the decode worker is held (SIGSTOP, well within
``worker_timeout``) between that write and the victim's ``decode.start``, and the stalled worker
resumes meanwhile: it runs the late job, writing its KV into the late request's pages. If those
pages went to the victim, the victim decodes from an overwritten prompt and its tokens leave the
reference model's; with pages freed only once no writer remains, they match exactly. At the
end every page is back: the late one's through its report, the probe's once its reservation
expired and its prefill worker, asked, said it never had the job.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from tests.conftest import Mooncake
from tests.daemons.serving.helpers import BLOCK, SERVING_ENV, Reference, complete, prompt, request, sse_events
from daemons.serving.messages import DropAnswer, KvTarget, PrefillJob, PrefillWriter, WriterProcess
from transfer.rpc.client_server import RpcClient

REQUEST_TIMEOUT = 5
FILLER_TOKENS, LATE_PROMPT, LATE_TOKENS, VICTIM_PROMPT, VICTIM_TOKENS = 6030, 592, 1480, 200, 16
PAGES = 256


def _pages(tokens: int) -> int:
    return -(-tokens // BLOCK)


def _wait_for(predicate, what: str, timeout: float = 20, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)


def test_a_late_prefill_never_writes_into_pages_given_to_another_request(tmp_path):
    runner = Mooncake(tmp_path / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "2", "MOONCAKE_DECODE_WORKERS": "1",
                       # The stalls below stay well inside this; the stalled prefill worker is
                       # dropped anyway, for failing its prefill.run call.
                       "MOONCAKE_WORKER_TIMEOUT": "3s",
                       # Short enough to see the probe's reservation expire during the race,
                       # long enough for every request of the race.
                       "MOONCAKE_REQUEST_TIMEOUT": f"{REQUEST_TIMEOUT}s",
                       # Prefix-cache placement (to steer each request to a worker), and no
                       # SLO or KV forecast turning a request away: the pages it needs exist.
                       "MOONCAKE_SCHEDULE_POLICY": "cache", "MOONCAKE_ADMISSION_POLICY": "none",
                       "MOONCAKE_TBT_SLO": "0"})
    info = runner.json("up", timeout=120)
    pids = {d["name"]: d["pid"] for d in info["daemons"]}
    clients = {d["name"]: RpcClient(d["address"], timeout=5, secret=runner.secret) for d in info["daemons"]
               if d["role"] in ("prefill", "decode")}
    try:
        url = next(d for d in info["daemons"] if d["role"] == "conductor")["http_address"]
        _race(url, pids, clients)
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)  # whatever failed, nothing stays stopped
        for client in clients.values():
            client.close()
        runner("down", timeout=60)


def _race(url: str, pids: dict[str, int], clients: dict[str, RpcClient]) -> None:
    decode = clients["decode-0"]

    def status(name: str) -> dict:
        return clients[name].call("status")

    assert status("decode-0")["free_blocks"] == PAGES
    writer = PrefillWriter("prefill-0", status("prefill-0")["address"],
                           [WriterProcess.from_wire(p) for p in status("prefill-0")["writers"]])
    probe = prompt(20, seed=74)
    target = KvTarget.from_wire(decode.call("decode.reserve", {
        "request_id": "cmpl-never-sent", "token_ids": probe, "max_tokens": 1, "writer": writer.to_wire()}))
    warm = prompt(40, seed=70)
    stalled = complete(url, prompt=warm, max_tokens=1)["mooncake"]["prefill"]
    other = next(name for name in ("prefill-0", "prefill-1") if name != stalled)
    filler = sse_events(url, {"prompt": prompt(40, seed=71), "max_tokens": FILLER_TOKENS}, timeout=60)
    assert next(filler)["choices"][0]["token_ids"]

    late_before = status(stalled)["num_done"]
    os.kill(pids[stalled], signal.SIGSTOP)
    late_prompt = warm[:BLOCK] + prompt(LATE_PROMPT - BLOCK + 1, seed=72)[1:]
    late = request(url, "POST", "/v1/completions",
                   json.dumps({"prompt": late_prompt, "max_tokens": LATE_TOKENS}).encode())
    assert late[0] == 502 and stalled in json.loads(late[2])["error"]["message"], late
    filler.close()  # the client goes away: the conductor cancels the filler and frees its pages
    # Out of the batch is not yet freed: a filler cancelled while a step runs gives its pages
    # back when that step ends. Only the probe's and the late request's stay held.
    held = _pages(len(probe) + 1) + _pages(LATE_PROMPT + LATE_TOKENS)

    def filler_freed() -> bool:
        now = status("decode-0")
        return now["running"] == 0 and now["free_blocks"] >= PAGES - held

    _wait_for(filler_freed, "the filler's pages to be freed")

    received, prefilled = status(other)["num_received"], status(other)["num_done"]
    victim_prompt = prompt(VICTIM_PROMPT, seed=73)
    victim: dict = {}
    victim_thread = threading.Thread(target=lambda: victim.update(response=request(
        url, "POST", "/v1/completions",
        json.dumps({"prompt": victim_prompt, "max_tokens": VICTIM_TOKENS}).encode())))
    victim_thread.start()

    # Held once its prefill job has arrived, not as soon as its pages are taken: the decode
    # worker takes them before its decode.reserve answer leaves, and a worker stopped in
    # between keeps that answer, and the prefill job with it, until the wait below times out.
    # The job's prefill (~50 ms of compute) leaves ample time to stop the decode worker
    # before the victim's decode.start.
    def victim_job_arrived() -> bool:
        assert victim_thread.is_alive(), f"the victim ended before it was held: {victim.get('response')}"
        return status(other)["num_received"] > received

    _wait_for(victim_job_arrived, "the victim's prefill job", step=0.001)
    os.kill(pids["decode-0"], signal.SIGSTOP)
    try:
        _wait_for(lambda: status(other)["num_done"] > prefilled, "the victim's prefill")
        os.kill(pids[stalled], signal.SIGCONT)
        _wait_for(lambda: status(stalled)["num_done"] > late_before, "the late prefill")
    finally:
        os.kill(pids["decode-0"], signal.SIGCONT)
    expected = Reference().tokens(victim_prompt, VICTIM_TOKENS)
    victim_thread.join(timeout=30)
    code, _, data = victim["response"]
    assert code == 200, data
    answer = json.loads(data)
    assert answer["mooncake"]["prefill"] == other
    assert answer["choices"][0]["token_ids"] == expected

    # The probe's prefill worker never had its job: it can no longer write, and its prefill.run
    # arriving now is refused. Every page comes back: none leaked.
    answer = DropAnswer.from_wire(clients["prefill-0"].call("prefill.drop", {"request_id": "cmpl-never-sent"}))
    assert answer.dropped and answer.process == writer.processes[0]
    late_run = PrefillJob("cmpl-never-sent", probe, 0, False, target)
    assert clients["prefill-0"].call("prefill.run", late_run.to_wire())["accepted"] is False
    _wait_for(lambda: status("decode-0")["free_blocks"] == PAGES, "every page to come back")
