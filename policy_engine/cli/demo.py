"""policy-engine demo: profile a small CPU training job under a policy, then say which rank
the others waited for and where each rank's step went.

By default a job of 4 ranks runs under torchrun (gloo, CPU): rollout, actor and ref in
every process, as verl's hybrid engine places them, the actor all-reducing its gradients
after each of 12 mini-batches; one rank (--slow-rank) computes --slow-ms longer before
each all-reduce. Steps 2 and 3 are profiled on every rank, and the demo ends with what
`policy-engine analyze` says of them. --world 1 runs rollout, actor, ref and critic in
this one process instead, and lists the traces. The output folder must be new or empty:
one run per folder, which analyze and compare read alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from policy_engine.analysis.listing import collect
from policy_engine.cli import ppo, traces
from policy_engine.cli._common import positive_int
from policy_engine.cli.demo_job import die_with_parent
from policy_engine.cli.usage import UsageError
from policy_engine.errors import printable
from policy_engine.files.interrupt import stopped_cleanly
from policy_engine.files.layout import MANIFEST_DIR
from policy_engine.language.model import Policy
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.topology import Topology

WORLD = 4
#: Mini-batches per training step in the job: the inner steps of each window, enough
#: samples for `policy-engine compare` to tell a change from noise.
MINI_BATCHES = 12
SLOW_MS = 100.0
#: The job's output, beside its traces (a dot file: `traces` lists no such file).
LOG = ".demo-job.log"
TAIL_LINES = 40
#: How torchrun begins its account of the first rank that failed.
_ROOT_CAUSE = "Root Cause (first observed failure)"
#: How long the job may take before it is stopped, beyond the slow rank's extra time.
JOB_SECONDS = 300
#: How long torchrun gets to stop its ranks after SIGTERM (it waits 30 s for them).
STOP_SECONDS = 45
#: Variables of a launcher that may have started this command; the job's torchrun sets
#: its own, and those of an outer job would mislead its ranks' discovery.
_LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_")


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("--policy", metavar="FILE",
                        help=f"policy to run (default: the built-in {ppo.JOB_POLICY}, "
                             f"{ppo.DEFAULT_POLICY} with --world 1)")
    parser.add_argument("--out", default="policy-engine-demo", metavar="DIR",
                        help="output folder, new or empty (default: ./policy-engine-demo)")
    parser.add_argument("--steps", type=positive_int, metavar="N",
                        help="training steps (default 3; 4 with --world 1)")
    parser.add_argument("--world", type=positive_int, default=WORLD, metavar="N",
                        help=f"ranks of the job (default {WORLD}); 1: one process, no job")
    parser.add_argument("--slow-rank", type=int, metavar="R",
                        help="the rank made slow (default: world // 2, rank 2 of 4)")
    parser.add_argument("--slow-ms", type=_milliseconds, default=SLOW_MS, metavar="MS",
                        help=f"how much longer the slow rank computes before each "
                             f"all-reduce (default {SLOW_MS:g}; 0: no rank is slow)")
    parser.set_defaults(run=run)


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 60_000:
        raise argparse.ArgumentTypeError(f"expected milliseconds from 0 to 60000, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    slow_rank = _slow_rank(args)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("the demo trains with PyTorch, which is not installed here: "
                         "pip install torch --index-url https://download.pytorch.org/whl/cpu")
    out = os.path.abspath(args.out)
    _fresh_folder(args.out)
    if args.world == 1:
        return _one_process(args, out)
    return _job(args, out, slow_rank)


def _job(args: argparse.Namespace, out: str, slow_rank: int) -> int:
    policy_file = os.path.abspath(args.policy) if args.policy else None
    # A bad policy stops here (exit 1), before any rank starts.
    _, label = ppo.demo_policy(policy_file, out, ppo.JOB_POLICY)
    steps = args.steps or 3
    slowness = (f"rank {slow_rank} slow (+{args.slow_ms:g} ms before each all-reduce)"
                if args.slow_ms else "no rank slow")
    print(f"policy-engine demo: a job of {args.world} ranks (torchrun, gloo, CPU), each "
          f"with rollout, actor and ref; {steps} training step{'s' if steps > 1 else ''} "
          f"of {MINI_BATCHES} mini-batches; {slowness}; policy: {label}", flush=True)
    began = time.perf_counter()
    worker = ["--out", out, "--steps", str(steps), "--mini-batches", str(MINI_BATCHES),
              "--slow-rank", str(slow_rank), "--slow-ms", str(args.slow_ms),
              *(["--policy", policy_file] if policy_file else [])]
    seconds = JOB_SECONDS + steps * MINI_BATCHES * args.slow_ms / 1000
    code, tail = run_job(args.world, worker, os.path.join(out, LOG), seconds)
    if code != 0:
        said = (f"did not finish within {seconds:.0f} s and was stopped" if code is None
                else f"failed (torchrun exited with {code})")
        print(f"policy-engine demo: error: the job {said}; its output ends:\n{tail}\n"
              f"(all of it: {os.path.join(out, LOG)})", file=sys.stderr)
        return 3  # the command's exit for a failure that is not the user's input
    print(f"trained in {time.perf_counter() - began:.1f} s\n", flush=True)
    if not _captured(out, steps, label):
        return 0
    traces.run(argparse.Namespace(dir=out, format="text"))
    print(f"\n$ policy-engine analyze {args.out}", flush=True)
    _answer(out, slow_rank if args.slow_ms else None)
    print(f"""
Traces are under {out}: one folder per step, one trace per rank. Next:
  - `policy-engine report {args.out} -o report.html`: the same on one page;
  - run the demo again with another --out and `policy-engine compare {args.out} OTHER`:
    two runs, window by window (a change or none, beyond the steps' noise);
  - Perfetto: open https://ui.perfetto.dev and drag a .pt.trace.json.gz file onto it
    (it runs in the browser; the trace is not uploaded).""")
    return 0


def _slow_rank(args: argparse.Namespace) -> int:
    if args.world == 1:
        if args.slow_rank is not None:
            raise UsageError("--slow-rank needs a job: give --world 2 or more")
        return -1
    rank: int = args.world // 2 if args.slow_rank is None else args.slow_rank
    if not 0 <= rank < args.world:
        raise UsageError(f"--slow-rank {rank} is not a rank of a job of {args.world} "
                         f"(0-{args.world - 1})")
    return rank


def _fresh_folder(out: str) -> None:
    """Refuse an output folder that holds anything: a second run beside the first would
    make one run of both in the reading tools' eyes."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} is not a folder")
    if os.path.isdir(out) and os.listdir(out):
        raise UsageError(f"--out {out} already holds files (an earlier run?): the demo "
                         f"writes one run per folder; give another folder or remove this one")


def _one_process(args: argparse.Namespace, out: str) -> int:
    policy, label = ppo.demo_policy(args.policy, out, ppo.DEFAULT_POLICY)
    steps = args.steps or 4
    print(f"policy-engine demo: 4 workers (rollout, actor, ref, critic) in one process, "
          f"{steps} PPO steps on the CPU, policy: {label}")
    for line in past_the_world(policy, ppo.ROLES):
        print(f"policy-engine demo: note: {line}")
    began = time.perf_counter()
    losses = ppo.run(policy, steps=steps)
    print(f"trained in {time.perf_counter() - began:.1f} s "
          f"(actor loss {losses['actor']:.3f}, critic loss {losses['critic']:.3f})\n")
    if not _captured(out, steps, label):
        return 0
    traces.run(argparse.Namespace(dir=out, format="text"))
    print(f"""
Traces are under {out}. To look at one:
  - Perfetto: open https://ui.perfetto.dev and drag a .pt.trace.json.gz file onto it
    (it runs in the browser; the trace is not uploaded);
  - `policy-engine analyze {args.out}`: each step's time, compute and idle, rank by rank.
The manifest under {os.path.join(out, 'manifests')} lists each capture's role, rank,
steps and status; `policy-engine traces {args.out}` prints this table again.""")
    return 0


def _captured(out: str, steps: int, label: str) -> bool:
    """Whether the run captured anything (its manifests list a capture: a rank that
    profiled nothing may still have noted the job's clock there); if not, say why."""
    if os.path.isdir(os.path.join(out, MANIFEST_DIR)):
        listing = collect(out, slim=True)
        if listing["traces"] or listing["interrupted"]:
            return True
    print(f"policy-engine demo: nothing was captured in {steps} training "
          f"step{'s' if steps > 1 else ''}: {label} profiles none of them (the built-in "
          f"policies profile steps 2 and 3: give --steps 3)")
    return False


def past_the_world(policy: Policy, roles: Sequence[str]) -> list[str]:
    """What the demo's one process (rank 0 of a world of 1) leaves out of the policy: the
    ranks each of its enabled ``roles`` selects past rank 0."""
    out = []
    for role in roles:
        spec = policy.role(role)
        if not spec.enabled or not spec.ranks.check(1, None):
            continue
        kept = compile_plan(policy, role, Topology()).enabled
        out.append(f"role {role} selects ranks {spec.ranks}, but the demo runs one process, "
                   f"rank 0 of 1: ranks past 0 are not profiled"
                   + ("" if kept else f" (role {role} profiles nothing here)"))
    return out


# ---------------------------------------------------------------- the job


def run_job(world: int, worker: Sequence[str], log: str,
            seconds: float) -> tuple[int | None, str]:
    """``demo_job`` on ``world`` ranks under torchrun, its output in ``log``: torchrun's
    exit code (None when it outlived ``seconds`` and was stopped) and the log's last
    lines. Ctrl-C, SIGTERM or an error here stop the job before this returns or raises:
    torchrun gets SIGTERM and stops its ranks; should it outlive that, it is killed, and
    its ranks, which die with their parent, with it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", "--max-restarts=0", "-m",
           "policy_engine.cli.demo_job", *worker]
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "wb") as sink, stopped_cleanly():
        # A session of its own: a Ctrl-C at the terminal reaches this process only, which
        # stops the job in order; torchrun (--standalone) finds a free port itself.
        job = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink,
                               stderr=subprocess.STDOUT, env=_job_env(),
                               start_new_session=True, preexec_fn=die_with_parent)
        try:
            code: int | None = job.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException as err:  # the job ends before this process does
            if not isinstance(err, Exception):  # Ctrl-C, SIGTERM
                print("policy-engine demo: interrupted: stopping the job (what its ranks "
                      "captured is kept, marked partial)", file=sys.stderr, flush=True)
            raise
        finally:
            _stop(job)
    return code, _tail(log)


def _job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER and not k.startswith(_LAUNCHER_PREFIXES)}
    # The ranks import this very package, wherever it was imported from here.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets, without its warning
    return env


def _stop(job: subprocess.Popen[bytes]) -> None:
    if job.poll() is not None:
        return
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _tail(log: str) -> str:
    """The log's last lines, from torchrun's account of the first rank that failed where
    it gave one (every rank's traceback before it is often the same one)."""
    with open(log, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64 * 1024))
        lines = f.read().decode("utf-8", "backslashreplace").splitlines()
    cause = [i for i, line in enumerate(lines) if _ROOT_CAUSE in line]
    if cause:
        lines = lines[cause[-1]:]
    return "\n".join("  " + printable(line) for line in lines[-TAIL_LINES:])


def _answer(out: str, slow_rank: int | None) -> None:
    """analyze's text for the run, then whether it named the rank made slow."""
    from policy_engine.analysis.run import analyze_run
    from policy_engine.analysis.text import render
    from policy_engine.cli.analyze import default_jobs

    result = analyze_run(out, jobs=default_jobs())
    try:
        print(render(result))
        named = [w.straggler["rank"] for w in result.windows if w.straggler]
    finally:
        result.close()
    windows = len(result.windows)
    if slow_rank is None:
        print(f"\nNo rank was made slow (--slow-ms 0): analyze names a straggler in "
              f"{len(named)} of {windows} windows.")
        return
    hits = named.count(slow_rank)
    others = sorted({r for r in named if r != slow_rank})
    print(f"\nThe demo made rank {slow_rank} slow: analyze names it the straggler in {hits} "
          f"of {windows} windows"
          + (f" (rank(s) {', '.join(map(str, others))} in the others)." if others else "."))
