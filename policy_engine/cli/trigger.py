"""policy-engine trigger OUTPUT_DIR --role ROLE: ask running processes to capture.
(--stall: ask every process that watches for stalls for its stall record instead.)

Posts a request on the job's channel: its c10d store (--store HOST:PORT, or where the job
advertised it under OUTPUT_DIR/triggers/), else a file under OUTPUT_DIR/triggers/. Every
process of ROLE that listens (its policy says ``triggers: {on_demand: true}``) notices it
at a training-step boundary within ``poll_seconds``, and captures the steps asked for
once, with the role's backend, schedule and names. "next" is resolved to one step that
every listening rank can still reach, from the progress they report. ``--wait`` reports
which processes accepted it and the traces they write. A request asks for at most 10000
steps (--count); a triggers/ folder that is a symbolic link is refused, never followed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from policy_engine.analysis.manifests import ManifestRecord, closed_steps, scan_manifests
from policy_engine.cli import trigger_stall, trigger_store
from policy_engine.cli.usage import UsageError
from policy_engine.files.publish import UnsafePathError, open_folder
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.selector import SelectorError
from policy_engine.runtime.triggers.requests import (
    MAX_COUNT,
    MAX_STEP,
    MAX_TEXT,
    REQUESTS_DIR,
    write_request,
)

_POLL = 0.5  # seconds between two looks at the manifests under --wait
#: --wait ends early only this long after the last new answer: processes notice a request
#: at their own pace (poll_seconds, 5 by default, at a step boundary), so the first
#: answers are not all of them.
_SETTLE = 10.0


def _step(text: str) -> int | None:
    if text == "next":
        return None
    digits = text.lstrip("0") or "0"
    if not text.isdigit() or len(digits) > 13 or int(digits) > MAX_STEP:
        raise argparse.ArgumentTypeError(
            f"expected a step number (0 to {MAX_STEP}) or 'next', got {text!r}")
    return int(text)


def _count(text: str) -> int:
    digits = text.lstrip("0")
    if not text.isdigit() or not digits:
        raise argparse.ArgumentTypeError(f"expected a positive number of steps, got {text!r}")
    if len(digits) > 6 or int(digits) > MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_COUNT} steps per request, got {text}: ask for fewer steps, "
            "or for a window later with --steps N")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", metavar="OUTPUT_DIR",
                        help="the policy's output_dir, where the processes write")
    parser.add_argument("--role", help="the role whose processes capture (required, "
                                       "but with --stall)")
    parser.add_argument("--stall", action="store_true",
                        help="ask every process that watches for stalls (triggers.stall) "
                             "for its stall record now, whatever its role; --wait reads "
                             "their answers on the job's store")
    parser.add_argument("--ranks", metavar="SEL",
                        help="which of them, as a policy's ranks: '0-3,8', '-1', or a "
                             "mapping such as '{tp: 0}' (default: every listening rank)")
    parser.add_argument("--steps", type=_step, default=None, metavar="N|next",
                        help="the first step to capture (default: next, the next step "
                             "each process starts)")
    parser.add_argument("--count", type=_count, default=1, metavar="K",
                        help=f"how many consecutive steps, 1 to {MAX_COUNT} (default: 1); "
                             "a process captures at most what its role's limits allow")
    parser.add_argument("--store", metavar="HOST:PORT",
                        help="the job's c10d store (MASTER_ADDR:MASTER_PORT); default: "
                             "where the job advertised it under OUTPUT_DIR/triggers/")
    parser.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS",
                        help="wait up to this long for the processes to answer and their "
                             "captures to close, and report them")
    parser.set_defaults(run=run)


def _ranks(text: str | None) -> Any:
    """The selector as the request carries it: checked here, so that no process has to
    refuse it."""
    if text is None:
        return None
    if len(text) > MAX_TEXT:
        raise UsageError(f"--ranks: at most {MAX_TEXT} characters, got {len(text)}")
    value: Any = text
    if text.lstrip().startswith(("{", "[")):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise UsageError(f"--ranks {text!r}: not a mapping or list: {err}") from None
    try:
        RankSelector.parse(value)
    except SelectorError as err:
        raise UsageError(f"--ranks {text!r}: {err.message}") from None
    return text if value is text else value


class _Process:
    """One process's answer to the request, and its captures of the role."""

    def __init__(self, note: ManifestRecord) -> None:
        self.note = note
        self.status = note.get("status")
        first, last = note.get("first"), note.get("last")
        if not isinstance(first, int) or not isinstance(last, int):
            listed = [s for s in note.get("captures") or () if isinstance(s, int)]
            first, last = (min(listed), max(listed)) if listed else (0, -1)
        self.first, self.last = first, last
        self.captures: dict[Any, dict[str, Any]] = {}  # capture id -> open line + more
        self.limited = False  # its role's limits stopped new captures

    def _accepted(self, steps: Sequence[Any]) -> list[int]:
        """The accepted steps among ``steps`` (a list, or the range of a long capture)."""
        if isinstance(steps, range):
            return list(range(max(steps.start, self.first), min(steps.stop, self.last + 1)))
        return [s for s in steps if isinstance(s, int) and self.first <= s <= self.last]

    def covered(self) -> set[int]:
        return {s for c in self.captures.values() if "closed" in c
                for s in self._accepted(c.get("covered") or ())}

    def ours(self) -> list[dict[str, Any]]:
        """Its captures of the steps it accepted, whatever opened them (the plan too)."""
        return [c for c in self.captures.values()
                if self._accepted(c.get("covered") or c.get("steps") or ())]

    def missing(self) -> int:
        """Accepted steps no closed capture covers yet."""
        if self.status != "accepted":
            return 0
        inside = sum(1 for s in self.covered() if self.first <= s <= self.last)
        return max(0, self.last - self.first + 1 - inside)

    def done(self) -> bool:
        return self.missing() == 0

    def settled(self) -> bool:
        """Nothing more will come: done, or its limits stop further captures."""
        return self.done() or self.limited

    def why_not(self) -> str:
        still = [c for c in self.ours() if "closed" not in c]
        shown = f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        what = f"{self.missing()} of the accepted steps {shown} not captured"
        if self.limited:
            return what + " (its role's limits stopped new captures: see its note: limit)"
        if still:
            return what + f" (a capture of step {still[0].get('steps')} is still open)"
        return what + " (the process has not reached them, or ended first)"


def _answers(output_dir: str, rid: str, role: str) -> dict[Any, _Process]:
    """The processes that answered request ``rid``, with their captures of ``role``."""
    records = scan_manifests(output_dir).records
    found: dict[Any, _Process] = {}
    for record in records:
        if record.get("event") == "note" and record.get("request") == rid:
            key = (record.get("host"), record.get("pid"))
            found.setdefault(key, _Process(record))
    by_id: dict[Any, dict[str, Any]] = {}  # (manifest file, capture id) -> its open line
    for record in records:
        event = record.get("event")
        if event in ("trace", "close"):  # these lines carry no host or pid
            known = by_id.get((record.get("_manifest"), record.get("capture")))
            if known is None:
                continue
            if event == "trace" and record.get("path"):
                known.setdefault("paths", []).append(record["path"])
            elif event == "close":
                known.update(closed=record.get("status"), covered=closed_steps(record))
            continue
        process = found.get((record.get("host"), record.get("pid")))
        if process is None:
            continue
        if event == "note" and record.get("note") == "limit" and record.get("role") == role:
            process.limited = True
        elif event == "open" and role in (record.get("roles") or (record.get("role"),)):
            capture = dict(record)
            process.captures[record.get("capture")] = capture
            by_id[(record.get("_manifest"), record.get("capture"))] = capture
    return found


def _wait(output_dir: str, rid: str, role: str, seconds: float,
          shown: set[Any] | None = None, settle: float | None = None,
          why_none: str | None = None) -> int:
    """Print the answers to request ``rid`` and its captures as they close; the exit
    status. It ends once every process that answered has settled and no new answer came
    for ``settle`` seconds (None: :data:`_SETTLE`), or at the deadline. ``why_none``: why
    no process may have answered, when there is more to say than how processes listen."""
    settle = _SETTLE if settle is None else settle
    deadline = time.monotonic() + seconds
    shown = set() if shown is None else shown
    last_new = time.monotonic()
    while True:
        found = _answers(output_dir, rid, role)
        for key, process in found.items():
            if key not in shown:
                shown.add(key)
                last_new = time.monotonic()
                print(trigger_store.say(process.note))
        settled = bool(found) and all(p.settled() for p in found.values())
        now = time.monotonic()
        if (settled and now - last_new >= settle) or now >= deadline:
            break
        time.sleep(_POLL)
    for process in found.values():
        for capture in process.ours():
            status = capture.get("closed", "still open")
            steps = capture.get("covered") or capture.get("steps")
            if isinstance(steps, range):  # a long capture: its first and last steps
                steps = f"{steps.start}-{steps.stop - 1}"
            for path in capture.get("paths") or ["(no file)"]:
                print(f"  rank {capture.get('rank')} steps {steps}: {status}: {path}")
    if not found:
        why = why_none or ("processes of the role listen with triggers: {on_demand: true}, "
                           "at their next training_step after poll_seconds")
        print(f"policy-engine trigger: no process answered within {seconds:g} s ({why})",
              file=sys.stderr)
        return 1
    if all(p.done() for p in found.values()):
        return 0
    for process in found.values():
        if not process.done():
            print(f"policy-engine trigger: rank "
                  f"{process.note.get('rank')} (pid {process.note.get('pid')}): "
                  f"{process.why_not()}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        status = _run(args)
    except UsageError as err:
        if trigger_store.stuck():  # a store call still blocks: said here, then gone
            print(f"policy-engine trigger: error: {err}", file=sys.stderr)
            trigger_store.leave(2)
        raise
    trigger_store.leave(status)
    return status


def _run(args: argparse.Namespace) -> int:
    root = args.output_dir
    if args.stall:
        if args.role is not None or args.ranks is not None or args.steps is not None or \
                args.count != 1:
            raise UsageError("--stall asks every watching process: no --role, --ranks, "
                             "--steps or --count")
        return trigger_stall.run(args)
    if args.role is None:
        raise UsageError("--role is required (or --stall)")
    if len(args.role) > MAX_TEXT:
        raise UsageError(f"--role: at most {MAX_TEXT} characters")
    found = trigger_store.find_channel(root, args.store, args.role)
    if isinstance(found, tuple):
        return _over_store(args, found)
    unanswered = found
    try:
        os.close(open_folder(root, REQUESTS_DIR, create=False))
    except FileNotFoundError:
        raise UsageError(
            f"{root}: no process listens for requests here (no {REQUESTS_DIR}/ folder): a "
            "role listens with triggers: {on_demand: true} and creates it when it starts"
        ) from None
    except UnsafePathError as err:
        raise UsageError(f"refused: {err}") from None
    except OSError as err:
        raise UsageError(f"{root}: cannot open {REQUESTS_DIR}/: {err.strerror or err}") \
            from None
    ranks = _ranks(args.ranks)
    step = args.steps if args.steps is not None else \
        trigger_store.folder_step(root, args.role)
    if unanswered is not None:
        said = unanswered.fell_back(root)
        if step is None:  # the processes publish their progress there once they left it
            said += ("; no process has written its progress under triggers/ yet, so each "
                     "takes the next step it starts after reading the request (--steps N "
                     "asks every one for the same step)")
        print(f"policy-engine trigger: {said}", file=sys.stderr, flush=True)
    try:
        request = write_request(root, role=args.role, ranks=ranks, step=step,
                                count=args.count)
    except UnsafePathError as err:
        raise UsageError(f"refused: {err}") from None
    except OSError as err:
        raise UsageError(f"{root}: cannot write the request: {err.strerror or err}") from None
    except ValueError as err:
        raise UsageError(str(err)) from None
    _said(request, args, ranks)
    if args.wait:
        return _wait(root, request["id"], args.role, args.wait,
                     why_none=unanswered.unanswered() if unanswered is not None else None)
    return 0


def _said(request: dict[str, Any], args: argparse.Namespace, ranks: Any) -> None:
    step = request["step"]
    steps = "the next step" if step is None else f"step {step}" + (
        " (the next step every listening rank can reach)" if args.steps is None else "")
    more = f" and the {args.count - 1} after it" if args.count > 1 else ""
    print(f"request {request['id']}: role {args.role!r}, ranks {ranks or 'all listening'}, "
          f"{steps}{more}", flush=True)


def _over_store(args: argparse.Namespace, found: Any) -> int:
    """The request through the job's store; ``--wait`` reads the answers there, then
    the captures in OUTPUT_DIR's manifests when this machine sees them."""
    ranks = _ranks(args.ranks)
    try:
        request, listeners = trigger_store.post(found, role=args.role, ranks=ranks,
                                                step=args.steps, count=args.count)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"through the job's store at {found[0]}, {listeners} listening process(es)")
    _said(request, args, ranks)
    if not args.wait:
        return 0
    start = time.monotonic()
    status, shown = trigger_store.answered(found, request["id"], listeners, args.wait)
    if not _answers(args.output_dir, request["id"], args.role):
        return status  # the ranks write where this machine does not see
    left = max(args.wait - (time.monotonic() - start), _POLL)
    # every listener answered on the store: no need to wait for late answers here
    settle = 0.0 if status == 0 else _SETTLE
    return max(status, _wait(args.output_dir, request["id"], args.role, left, shown, settle))
