"""Stress the thread model on real torch.profiler: python stress_torch.py OUT SEED.

Colocated actor and ref drive their own training steps in their own threads, extra
threads call step() and run ops, regions enclose inner steps, some steps raise. The
process must exit 0; the test then checks the manifest and the traces.
"""

from __future__ import annotations

import random
import sys
import threading

import torch

from policy_engine import Topology, apply_policy

out, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
role = {"enabled": True, "steps": "1-5", "regions": ["update"],
        "schedule": {"wait": 1, "warmup": 1, "active": 2, "repeat": 2},
        "name": "<role>_step<step>_c<cycle>_<timestamp>", "torch": {"activities": ["cpu"]}}
policy = {"version": 1, "output_dir": out, "colocate": [["actor", "ref"]],
          "roles": {"actor": dict(role), "ref": dict(role)}}
stop = threading.Event()


class Worker:
    def __init__(self, name: str) -> None:
        self.x = torch.randn(32, 32, requires_grad=True)
        self.prof = apply_policy(self, name, policy, Topology())

    def update(self, inner: int, fail: bool) -> None:
        for _ in range(inner):
            (self.x @ self.x).sum().backward()
            self.prof.step()
        if fail:
            raise KeyError("boom")


def trainer(worker: Worker, local: random.Random) -> None:
    for n in range(1, 7):
        try:
            with worker.prof.training_step(n):
                worker.update(local.randint(0, 8), fail=local.random() < 0.15)
        except KeyError:
            pass


def busy() -> None:
    y = torch.randn(16, 16)
    while not stop.is_set():
        with torch.autograd.profiler.record_function("busy"):
            (y @ y).sum()


def stepper(worker: Worker) -> None:
    for _ in range(30):
        worker.prof.step()


for _round in range(3):
    actor, ref = Worker("actor"), Worker("ref")
    threads = [threading.Thread(target=trainer, args=(actor, random.Random(rng.random()))),
               threading.Thread(target=trainer, args=(ref, random.Random(rng.random()))),
               *[threading.Thread(target=stepper, args=(actor,)) for _ in range(4)],
               *[threading.Thread(target=busy) for _ in range(2)]]
    for t in threads:
        t.start()
    for t in threads[:-2]:
        t.join()
    stop.set()
    for t in threads[-2:]:
        t.join()
    stop.clear()
    actor.prof.close()
    ref.prof.close()
print("ok")
