"""The stall of the step that ends a capture: sync export vs background export.

    python benchmarks/bench_export.py [--rounds N] [--device cpu|cuda]

The stall is the time from the end of the last recorded step's work until the training
thread continues after ``training_step(n)`` returns: the profiler stops, and then (sync)
the trace is serialised, gzipped, synced and published on the training thread, or
(background) handed to the export thread. Rounds alternate between the two so drift hits
both alike; the export thread is drained between rounds, outside the measurement.

Two settings: the engine's torch defaults, and ``record_shapes: true``, under which
torch's own stop (which must stay on the training thread) takes a larger share.

Target (README, "Performance"): background <= 0.5 x sync.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from policy_engine import Topology, profile_session
from policy_engine.runtime.process import export, summaries


def policy(out: str, mode: str, device: str, shapes: bool) -> dict[str, Any]:
    activities = ["cpu", "cuda"] if device == "cuda" else ["cpu"]
    return {"version": 1, "output_dir": out, "roles": {"trainer": {
        "enabled": True, "steps": "all", "name": f"{mode}{int(shapes)}/step<step>",
        "torch": {"activities": activities, "record_shapes": shapes},
        "export": {"mode": mode}}}}


def stall(prof: Any, step: int, work: Any) -> float:
    with prof.training_step(step):
        work()
        began = time.perf_counter()  # the last recorded step's work is done
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(12)]).to(device)
    data = torch.randn(64, 512, device=device)

    def work() -> None:
        for _ in range(20):  # enough operators for a trace of a few MB
            model(data).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    print(f"device {args.device}, {args.rounds} rounds, median stall of the step that ends a "
          "capture:")
    for shapes, label in ((False, "the engine's torch defaults"),
                          (True, "record_shapes: true")):
        with tempfile.TemporaryDirectory() as out:
            profs = {mode: profile_session(policy(out, mode, args.device, shapes), "trainer",
                                           Topology())
                     for mode in ("sync", "background")}
            stalls: dict[str, list[float]] = {"sync": [], "background": []}
            for step in range(args.rounds + 1):
                for mode, prof in profs.items():
                    took = stall(prof, step, work)
                    export.flush()
                    if step:  # the first round pays lazy imports
                        stalls[mode].append(took)
            for prof in profs.values():
                prof.close()
            summaries.wait(60)  # the traces' summaries, before their folder goes
        sync, background = (statistics.median(stalls[m]) for m in ("sync", "background"))
        print(f"  {label}: sync {sync * 1000:.1f} ms, background {background * 1000:.1f} ms, "
              f"background / sync {background / sync:.2f}x (target <= 0.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
