"""What the engine costs training code, as ratios measured in one run.

    python benchmarks/bench_overhead.py

Targets (README, "Performance"):
  off rank:  step() and training_step() <= ~1.2x a no-op method call; regions untouched
  on rank, nothing recording: step() and a region call <= ~10x a bare function call
  on rank, a step not profiled: training_step(n) with every trigger on <= 1.2x without
  a capture driven by the engine <= ~1.05x raw torch.profiler with the same schedule
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import timeit
import warnings
from collections.abc import Callable
from typing import Any

from policy_engine import Topology, apply_policy, profile_session
from policy_engine.runtime.process import export, summaries

N = 200_000


def best(fn: Callable[[], Any], number: int = N, repeat: int = 7,
         timer: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call: the minimum over repeats (the least disturbed by the machine)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=timer)) / number


class Worker:
    def update_actor(self) -> int:
        return 1

    def noop(self) -> None:
        pass


def bare() -> int:
    return 1


def policy(out: str, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "torch": {"activities": ["cpu"]}}
    body.update(role)
    return {"version": 1, "output_dir": out, "roles": {"actor": body}}


def off_rank(out: str) -> dict[str, float]:
    worker = Worker()
    method = worker.update_actor
    prof = apply_policy(worker, "actor", policy(out, ranks=[1], steps=[1],
                                                regions=["update_actor"]),
                        Topology(rank=0, world=2))
    assert worker.update_actor == method and "update_actor" not in vars(worker)
    noop = best(worker.noop)
    return {
        "off step() / no-op method": best(prof.step) / noop,
        "off training_step(n) / no-op method": best(lambda: prof.training_step(3)) /
        best(lambda: worker.noop()),
    }


def on_rank_idle(out: str) -> dict[str, float]:
    import torch.profiler

    worker = Worker()
    # Steps 10+ are profiled; step 0 is not: step() and regions run outside any capture.
    prof = apply_policy(worker, "actor", policy(out, steps=[10], regions=["update_actor"],
                                                schedule={"wait": 10**9, "active": 1,
                                                          "repeat": 1}),
                        Topology())
    base = best(bare)
    with prof.training_step(0):  # step 0 is not profiled: no capture is open
        out_step = best(prof.step)
        out_region = best(worker.update_actor)
    # Inside a capture whose schedule is in a long NONE (wait) phase.
    with prof.training_step(10):
        none_step = best(prof.step)
        none_region = best(worker.update_actor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                     schedule=torch.profiler.schedule(wait=10**9, warmup=0,
                                                                      active=1))
        raw.start()
        torch_none = best(raw.step, number=20_000, repeat=3)
        raw.stop()
    return {
        "on step() outside a capture / bare call": out_step / base,
        "on region call outside a capture / bare call": out_region / base,
        "on step() in NONE phase / bare call": none_step / base,
        "on region call in NONE phase / bare call": none_region / base,
        "(torch.profiler step() in NONE / bare call)": torch_none / base,
    }


def triggers_idle(out: str) -> dict[str, float]:
    """``with prof.training_step(n): pass`` on a step nothing captures, with and without
    every trigger, on rank 0 of 2 with no store: the role's listener thread reads the
    requests folder at its default period and publishes the step there (the job's
    channel); the training thread hands it the step and looks at its inbox. Every step is
    measured for ``slow_step``, against a factor no pause of the machine reaches: a step
    counted as slow would open captures inside the timed loop."""
    plain = apply_policy(Worker(), "actor", policy(out, steps=[], name="<step>"),
                         Topology(rank=0, world=2))
    every = {"on_demand": True, "signal": True,
             "slow_step": {"factor": 1e9, "after": 10, "scope": "job", "reference": "1"}}
    listening = apply_policy(Worker(), "actor", policy(out, steps=[], name="<step>",
                                                       triggers=every),
                             Topology(rank=0, world=2))
    # the same with the stall watch on (a limit no step reaches): its listener thread
    # watches the steps, the training thread writes the step that ended
    watching = apply_policy(Worker(), "actor", policy(out, steps=[], name="<step>", triggers={
        **every, "stall": {"after": 3600}}), Topology(rank=0, world=2))
    n = iter(range(10**9))

    def loop(prof: Any) -> Callable[[], None]:
        def one() -> None:
            with prof.training_step(next(n)):
                pass
        return one

    # The process's CPU time (its listener thread's included), not the wall clock: on a
    # shared machine the wall clock counts the time other processes ran; interleaved, so
    # that the machine's drift hits both alike.
    base = best(bare, timer=time.process_time)
    runs: tuple[list[float], list[float], list[float]] = ([], [], [])
    for _ in range(7):
        runs[0].append(best(loop(plain), repeat=1, timer=time.process_time))
        runs[1].append(best(loop(listening), repeat=1, timer=time.process_time))
        runs[2].append(best(loop(watching), repeat=1, timer=time.process_time))
    without, with_triggers, with_stall = min(runs[0]), min(runs[1]), min(runs[2])
    plain.close()
    listening.close()  # its listener thread stops before the folder is removed
    watching.close()
    return {
        "on training_step(n), not profiled / bare call": without / base,
        "on training_step(n) with triggers / without": with_triggers / without,
        "on training_step(n) with triggers and stall / without": with_stall / without,
    }


def capture_vs_raw(out: str, rounds: int = 7) -> dict[str, float]:
    import torch
    import torch.profiler

    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    data = torch.randn(64, 256)
    sched = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    steps = 8

    def work() -> None:
        model(data).sum().backward()

    def raw_run() -> float:
        began = time.perf_counter()
        with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                schedule=torch.profiler.schedule(**sched),
                on_trace_ready=lambda p: p.export_chrome_trace(
                    tempfile.mktemp(dir=out, suffix=".pt.trace.json.gz"))) as prof:
            for _ in range(steps):
                work()
                prof.step()
        return time.perf_counter() - began

    def engine_run() -> float:
        prof = profile_session(policy(out, steps=[0], schedule=sched), "actor", Topology())
        began = time.perf_counter()
        with prof.training_step(0):
            for _ in range(steps):
                work()
                prof.step()
        export.flush()  # the trace written, as raw's is (the engine writes it off-thread)
        return time.perf_counter() - began

    raw_run(), engine_run()  # first profiler start in a process pays lazy imports
    raws, engines = [], []
    for _ in range(rounds):  # interleaved, so drift hits both alike
        raws.append(raw_run())
        engines.append(engine_run())
    return {"engine capture / raw torch.profiler (median)":
            statistics.median(engines) / statistics.median(raws)}


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        results = {**off_rank(out), **on_rank_idle(out), **triggers_idle(out),
                   **capture_vs_raw(out)}
        summaries.wait(60)  # the traces' summaries, before their folder goes
    width = max(map(len, results))
    for name, ratio in results.items():
        print(f"{name.ljust(width)}  {ratio:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
