"""The trigger channel at scale: one TCPStore serving many listening clients.

    python benchmarks/bench_channel.py [--clients 1024] [--poll 2] [--requests 4]

A TCPStore runs in a process of its own (as torchrun's agent runs it). ``--clients``
listeners, threads spread over a few processes, each with its own client connection,
do what a rank's listener thread does
(:mod:`policy_engine.runtime.triggers.listener_thread`), with the same keys
(:class:`~policy_engine.runtime.triggers.channel.JobChannel`): every ``--poll``
seconds publish their progress (a simulated step counter at 10 steps/s, each started at a
random phase) and read the request list. A requester posts ``--requests`` requests,
each resolved to one step from every client's progress (:func:`agreed_step`), as
``policy-engine trigger`` does.

Reported: the delivery time of every request to every client (p50, p99, max, as a multiple
of the poll interval; target: p99 <= 2x), whether every client could still reach the
agreed step, the store's request rate and its CPU (from /proc), the time to resolve a step
(reading every client's progress), and the same extrapolated to 16,384 ranks polling every
5 s (the default) — load is linear in clients / poll.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from policy_engine.runtime.triggers.channel import JobChannel, agreed_step, connect_store
from policy_engine.runtime.triggers.requests import request_body

RATE = 10.0  # simulated steps per second of every client


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(port: int, count: int, poll: float, stop: Any, results: Any) -> None:
    """``count`` listener threads in this process; each sends back its deliveries."""
    seen: list[dict[str, Any]] = []
    ops = [0]
    spans: list[float] = []
    lock = threading.Lock()

    def listen(index: int) -> None:
        job = JobChannel(connect_store("127.0.0.1", port, timeout=60), "trainer")
        slot = job.register(json.dumps({"client": index, "pid": os.getpid()}).encode())
        cursor = job.cursor()
        start = time.time() - random.uniform(0, 5)  # ranks at slightly different steps
        time.sleep(random.uniform(0, poll))  # a random poll phase
        done = 0
        began = time.time()
        while not stop.is_set():
            now = time.time()
            step = int((now - start) * RATE)
            job.publish(slot, {"step": step, "time": now, "rate": RATE, "poll": poll})
            job.hint()  # as a listener polls: its progress, where the list ends, the next key
            done += 3
            while True:
                found = job.request(cursor)
                done += 1 if found is None else 2
                if found is None:
                    break
                body = json.loads(found)
                got = time.time()
                with lock:
                    seen.append({"posted": body["created"], "got": got, "agreed": body["step"],
                                 "step": int((got - start) * RATE) + 1})
                cursor += 1
            time.sleep(max(0.0, poll - (time.time() - now)))
        with lock:
            ops[0] += done
            spans.append(time.time() - began)

    threads = [threading.Thread(target=listen, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put({"seen": seen, "ops": ops[0], "seconds": sum(spans) / max(len(spans), 1)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
         "print(s.port, flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    job = JobChannel(connect_store("127.0.0.1", port), "trainer")
    between = 3 * args.poll
    results: Any = multiprocessing.Queue()
    stop = multiprocessing.Event()
    per = [args.clients // args.processes + (i < args.clients % args.processes)
           for i in range(args.processes)]
    procs = [multiprocessing.Process(target=_client, args=(port, n, args.poll, stop, results))
             for n in per]
    for proc in procs:
        proc.start()
    while job.listeners() < args.clients:
        time.sleep(0.2)
    time.sleep(2 * args.poll)  # every client has reported
    cpu0, wall0 = _cpu_seconds(server.pid), time.time()
    resolve: list[float] = []
    for _ in range(args.requests):
        t = time.perf_counter()
        step = agreed_step(job.reports(), time.time(), 0.0)
        resolve.append(time.perf_counter() - t)
        _, body = request_body(role="trainer", ranks=None, step=step, count=1)
        job.post(body)
        time.sleep(between)
    cpu1, wall1 = _cpu_seconds(server.pid), time.time()
    stop.set()
    gathered = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    server.stdin.close()
    server.wait()
    seen = [s for g in gathered for s in g["seen"]]
    delays = sorted((s["got"] - s["posted"]) / args.poll for s in seen)
    late = sum(1 for s in seen if s["step"] > s["agreed"])
    # what the clients asked of the store, per second of their run
    ops_rate = sum(g["ops"] / g["seconds"] for g in gathered if g["seconds"])
    cpu = (cpu1 - cpu0) / (wall1 - wall0)
    big = 16384 * 2 / 5.0
    report = {
        "clients": args.clients, "poll_seconds": args.poll,
        "deliveries": len(seen), "expected": args.clients * args.requests,
        "delivery_p50_polls": round(statistics.median(delays), 3),
        "delivery_p99_polls": round(delays[int(0.99 * (len(delays) - 1))], 3),
        "delivery_max_polls": round(delays[-1], 3),
        "past_the_agreed_step_at_delivery": late,
        "store_requests_per_s": round(ops_rate),
        "store_cpu_fraction_of_a_core": round(cpu, 3),
        "resolve_seconds": round(max(resolve), 3),
        "at_16384_ranks_poll_5s": {
            "store_requests_per_s": round(big),
            "store_cpu_fraction_of_a_core": round(cpu * big / ops_rate, 3),
            "resolve_seconds": round(max(resolve) * 16384 / args.clients, 2)},
    }
    print(json.dumps(report, indent=2))
    return 0 if report["delivery_p99_polls"] <= 2 and not late and \
        len(seen) == report["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
