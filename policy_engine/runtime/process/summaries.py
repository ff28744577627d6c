"""Summaries of torch traces, made by the rank that recorded them, off its GIL.

Once a torch trace is written and its ``trace`` line appended (runtime.capture.lines), it is
handed here. A worker process (``python -m policy_engine.analysis.summarize_main``, at
the lowest CPU priority, no stdin, no inherited descriptors, its data segment held to
:data:`MEMORY_BYTES`) reads it, and a daemon thread of this process, blocked reading the
worker's pipes (which releases the GIL), appends one ``summary`` line to the manifest:
the figures ``analyze`` reads, or why there are none. The pure-Python work never runs on
a thread of the training process.

At most :data:`WORKERS` workers run at once and :data:`MAX_WAITING` traces wait; past
that a trace is not summarised (its line says so). A worker that runs past
:data:`TIMEOUT` is killed. The worker fits its summary to the line itself: past
:data:`MAX_SUMMARY_BYTES` it leaves out the bulky parts, past :data:`MAX_KEPT_BYTES` the
last steps (the line's ``trimmed`` says so). This process reads at most
:data:`MAX_OUT` bytes of its output and :data:`MAX_ERR` of what it says on stderr, and
kills a worker that prints more: a worker's output costs the training process the same
memory whatever it is.

With ``keep: summaries`` a trace whose summary is complete is removed after its line is
written, and its bytes go back to the role's ``limits.bytes``; a trace whose summary
failed or was cut stays. At exit and on SIGTERM (runtime.process.signals) summaries under way get
:data:`EXIT_WAIT` seconds, then their workers are killed and their lines say ``cut``.
Nothing here raises into a capture or the training loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from policy_engine.analysis.summarize_main import MAX_KEPT_BYTES, MAX_SUMMARY_BYTES, MEMORY_BYTES
from policy_engine.backends.files import TORCH_GZIP, TORCH_PLAIN
from policy_engine.files.publish import folder
from policy_engine.files.records import Status, SummaryStatus, summary_line
from policy_engine.runtime.process import manifest
from policy_engine.runtime.process.budget import Budget
from policy_engine.runtime.process.state import STATE, critical, warn_once

log = logging.getLogger("policy_engine")

#: Worker processes per process at once, and traces waiting for one.
WORKERS = 2
MAX_WAITING = 64
#: Seconds a worker may run before it is killed (its summary fails).
TIMEOUT = 1800.0
#: Seconds summaries under way get at exit and on SIGTERM before they are cut.
EXIT_WAIT = 5.0
#: The workers' nice value: the lowest priority.
NICE = 19
#: What a worker's stdout (its one line) and stderr may hold: past it, it is killed.
MAX_OUT = MAX_KEPT_BYTES + (4 << 10)
MAX_ERR = 64 << 10
WORKER = "policy_engine.analysis.summarize_main"
#: The folder this package is imported from: the worker imports the same one.
_SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SAID = 300  # characters of a worker's own words kept in an error


class Job:
    """One trace to summarise; ``done`` once its line is claimed (by its worker's thread,
    or by the exit that cut it)."""

    __slots__ = ("budget", "done", "full", "output_dir", "proc", "remove", "started",
                 "trace")

    def __init__(self, output_dir: str, trace: Mapping[str, Any], full: str, *,
                 remove: bool, budget: Budget | None) -> None:
        self.output_dir = output_dir
        self.trace = trace  # its trace line
        self.full = full
        self.remove = remove  # keep: summaries
        self.budget = budget
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.done = False


#: status, summary, error, trimmed
Outcome = tuple[SummaryStatus, dict[str, Any] | None, str | None, str | None]


class Pool:
    """The process's summary workers: a bounded queue, at most WORKERS threads."""

    __slots__ = ("cond", "running", "threads", "waiting")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.waiting: deque[Job] = deque()
        self.running: set[Job] = set()
        self.threads = 0

    def submit(self, job: Job) -> None:
        # A critical stretch: a SIGTERM handler that finished the pool here would wait
        # for the lock this thread holds (runtime.process.state).
        with critical(), self.cond:
            full = len(self.waiting) >= MAX_WAITING
            if not full:
                self.waiting.append(job)
                if self.threads < WORKERS:
                    self.threads += 1
                    threading.Thread(target=self._run, daemon=True,
                                     name="policy-engine-summary").start()
        if full:
            self.conclude(job, (SummaryStatus.FAILED, None, f"{MAX_WAITING} traces were "
                                "already waiting for their summaries: this one is not "
                                "summarised", None))

    def _run(self) -> None:
        while True:
            with self.cond:
                if not self.waiting:
                    self.threads -= 1  # idle: the thread ends, none is left at shutdown
                    self.cond.notify_all()
                    return
                job = self.waiting.popleft()
                self.running.add(job)
            try:
                self._work(job)
            except BaseException as err:  # a last resort: the line says what it can
                self.conclude(job, (SummaryStatus.FAILED, None,
                                    f"{type(err).__name__}: {err}", None))
            finally:
                with self.cond:
                    self.running.discard(job)
                    self.cond.notify_all()

    def _work(self, job: Job) -> None:
        job.started = time.monotonic()
        try:
            proc = _spawn(job.full)
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            self.conclude(job, (SummaryStatus.FAILED, None,
                                f"the summary worker could not start: {err}", None))
            return
        with self.cond:
            job.proc = proc
            cut = job.done
        if cut:  # the process began to end while the worker started
            proc.kill()
        deadline = job.started + TIMEOUT
        try:
            out, said, stopped = _read(proc, deadline)
            if stopped is None:  # both pipes closed: the worker is ending
                proc.wait(max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            stopped = _too_long()
        finally:
            if proc.returncode is None:  # cut off, or this thread failed
                with contextlib.suppress(OSError):
                    proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if stopped is not None:
            self.conclude(job, (SummaryStatus.FAILED, None, stopped, None))
            return
        self.conclude(job, _outcome(out, said, proc.returncode))

    def conclude(self, job: Job, outcome: Outcome) -> None:
        """Write ``job``'s one line (unless another thread did), then remove its trace
        when the role keeps summaries only and the summary is complete."""
        with critical(), self.cond:
            if job.done:
                return
            job.done = True
        _record(job, outcome)

    def wait(self, timeout: float | None) -> bool:
        """Wait until no summary waits or runs; False if ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with critical(), self.cond:
            while self.waiting or self.running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def finish(self, wait: float) -> None:
        """The process ends: summaries get ``wait`` seconds, then the rest are cut (their
        workers killed, their lines written here)."""
        if self.wait(wait):
            return
        with critical(), self.cond:
            left = [*self.waiting, *self.running]
            self.waiting.clear()
            cut = [job for job in left if not job.done]
            for job in cut:
                job.done = True
                if job.proc is not None:
                    with contextlib.suppress(OSError):
                        job.proc.kill()
        for job in cut:
            _record(job, (SummaryStatus.CUT, None, "cut short by exit: the process ended "
                          "before the summary was made", None))


def _spawn(path: str) -> subprocess.Popen[bytes]:
    """A worker summarising ``path``, at the lowest priority."""
    env = dict(os.environ)  # the worker imports this very package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", WORKER, path, "--parent", str(os.getpid()),
         "--trim-bytes", str(MAX_SUMMARY_BYTES), "--max-bytes", str(MAX_KEPT_BYTES),
         "--memory-bytes", str(MEMORY_BYTES)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        close_fds=True, env=env)
    with contextlib.suppress(OSError, AttributeError):  # a platform without setpriority
        os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
    return proc


def _read(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes, str | None]:
    """What the worker writes to stdout and stderr until it closes both, at most
    :data:`MAX_OUT` and :data:`MAX_ERR` bytes; and why it was cut off (None when it was
    not): past either or past ``deadline`` (monotonic), the caller kills it."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    most = {proc.stdout.fileno(): MAX_OUT, proc.stderr.fileno(): MAX_ERR}
    with selectors.DefaultSelector() as pipes:
        for fd in kept:
            pipes.register(fd, selectors.EVENT_READ)
        while pipes.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return b"", b"", _too_long()
            for key, _ in pipes.select(min(left, 1.0)):
                fd = key.fd
                data = os.read(fd, most[fd] + 1 - len(kept[fd]))
                if not data:
                    pipes.unregister(fd)
                    continue
                kept[fd] += data
                if len(kept[fd]) > most[fd]:
                    what = "printed" if fd == proc.stdout.fileno() else "wrote to stderr"
                    return b"", b"", (f"the summary worker {what} more than {most[fd]} "
                                      "bytes: it was killed")
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), None


def _too_long() -> str:
    return f"the summary took longer than {TIMEOUT:g} s: its worker was killed"


_MEMORY_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL, signal.SIGBUS)


def _said(data: bytes) -> str:
    """The last line a worker wrote to stderr, shortened."""
    lines = data.decode("utf-8", "replace").strip().splitlines()
    text = lines[-1] if lines else "nothing on stderr"
    return text if len(text) <= _SAID else text[:_SAID - 3] + "..."


def _outcome(out: bytes, err: bytes, code: int) -> Outcome:
    """What a worker's output says: the summary, or why there is none."""
    if code < 0:
        name = f"signal {-code}"
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
        hint = (f" (perhaps out of memory: a worker is held to {MEMORY_BYTES >> 20} MiB)"
                if -code in _MEMORY_SIGNALS else "")
        return SummaryStatus.FAILED, None, f"the summary worker was ended by {name}{hint}", None
    if code != 0:
        return (SummaryStatus.FAILED, None, f"the summary worker exited with status {code}: "
                f"{_said(err)}", None)
    try:
        found = json.loads(out.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return (SummaryStatus.FAILED, None, f"the summary worker printed no summary: "
                f"{_said(out or err)}", None)
    if not isinstance(found, dict):
        return SummaryStatus.FAILED, None, "the summary worker printed no summary object", None
    if "error" in found:
        return SummaryStatus.FAILED, None, str(found["error"])[:_SAID], None
    summary, trimmed = found.get("summary"), found.get("trimmed")
    if not isinstance(summary, dict) or not isinstance(trimmed, (str, type(None))):
        return SummaryStatus.FAILED, None, "the summary worker printed no summary object", None
    return SummaryStatus.COMPLETE, summary, None, trimmed


def _record(job: Job, outcome: Outcome) -> None:
    """Append ``job``'s summary line; then remove its trace when the role keeps only
    summaries and this one is complete. A trace is removed only once its line is
    written."""
    status, summary, error, trimmed = outcome
    trace = job.trace
    remove = job.remove and status is SummaryStatus.COMPLETE and _removable(job)
    fields: dict[str, Any] = {"kept": not remove, "seconds": round(
        time.monotonic() - job.started, 3) if job.started else 0.0}
    if summary is not None:
        fields["summary"] = summary
    if error is not None:
        fields["error"] = error
        warn_once(("summary", status), "policy-engine: the summary of %s %s: %s "
                  "(the trace is kept; later ones are not warned about)", trace.get("path"),
                  "was cut" if status is SummaryStatus.CUT else "failed", error)
    if trimmed is not None:
        fields["trimmed"] = trimmed
    line = summary_line({"role": trace.get("role"), "rank": trace.get("rank")},
                        capture=str(trace.get("capture")), path=trace.get("path"),
                        status=status, **fields)
    try:
        manifest.append(job.output_dir, line)
    except OSError as err:
        warn_once(("summary-line", job.output_dir), "policy-engine: a summary line could "
                  "not be written to the manifest under %s (%s); its trace is kept",
                  job.output_dir, err.strerror or err)
        return
    if remove:
        _remove(job)


def _where(job: Job) -> tuple[str, str]:
    """The trace's folder (relative to the output folder) and its name."""
    rel = os.path.relpath(job.full, job.output_dir)
    return os.path.dirname(rel), os.path.basename(rel)


def _removable(job: Job) -> bool:
    """Whether the trace is still the file its line names: a regular file of its size,
    reached without following a link."""
    sub, name = _where(job)
    try:
        with folder(job.output_dir, sub, create=False) as fd:
            found = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_size == job.trace.get("bytes")


def _remove(job: Job) -> None:
    sub, name = _where(job)
    try:
        with folder(job.output_dir, sub, create=False) as fd:
            os.unlink(name, dir_fd=fd)
    except OSError as err:
        warn_once(("summary-remove", job.output_dir), "policy-engine: %s could not be "
                  "removed after its summary (%s): it stays, though its summary line says "
                  "kept: false", job.full, err.strerror or err)
        return
    if job.budget is not None:
        job.budget.freed(job.trace.get("bytes"))


# -- what the runtime calls ---------------------------------------------------------------

#: torch_npu's folder of one capture (the mstx backend's trace), summarised as a torch
#: trace is once torch_npu has analysed it (its ``trace_view.json``).
ASCEND_FOLDER = "_ascend_pt"


def wanted(path: str | None, part: str | None, status: Status,
           extra: Mapping[str, Any] | None = None) -> bool:
    """Whether a trace line's file is summarised: a torch trace, or an Ascend capture
    torch_npu has analysed (``extra``: its trace line's, which says so), complete or
    partial."""
    if not path or status not in (Status.COMPLETE, Status.PARTIAL):
        return False
    if str(path).endswith(ASCEND_FOLDER):
        return part in (None, "mstx") and bool((extra or {}).get("analysed"))
    return part in (None, "torch") and str(path).endswith((TORCH_GZIP, TORCH_PLAIN))


def order(output_dir: str, trace: Mapping[str, Any], full: str, *, keep: str,
          budget: Budget | None) -> None:
    """Summarise the trace at ``full`` (its trace line ``trace`` is written); never
    raises."""
    try:
        if not (os.path.isdir(full) if full.endswith(ASCEND_FOLDER) else os.path.isfile(full)):
            return
        job = Job(output_dir, dict(trace), os.path.abspath(full),
                  remove=keep == "summaries", budget=budget)
        pool().submit(job)
    except Exception as err:
        warn_once(("summary-order",), "policy-engine: a trace could not be handed to its "
                  "summary worker: %s: %s", type(err).__name__, err)


def pool() -> Pool:
    """This process's pool (made on first use)."""
    with STATE.lock:
        found = STATE.summaries
        if not isinstance(found, Pool):  # none yet: the slot holds nothing else
            found = Pool()
            STATE.summaries = found
        return found


def wait(timeout: float | None = None) -> bool:
    """Wait for every summary of this process to be written (tests, benchmarks)."""
    found = STATE.summaries
    return True if found is None else found.wait(timeout)


def finish(wait_for: float | None = None) -> None:
    """At exit and on SIGTERM: wait ``wait_for`` seconds at most (:data:`EXIT_WAIT`),
    then cut the rest."""
    found = STATE.summaries
    if found is not None:
        found.finish(EXIT_WAIT if wait_for is None else wait_for)
