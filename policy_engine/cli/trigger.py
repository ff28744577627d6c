"""policy-engine trigger OUTPUT_DIR --role ROLE: ask running processes to capture.

Writes a request under OUTPUT_DIR/triggers/. Every process of ROLE that writes under
OUTPUT_DIR and listens (its policy says ``triggers: {on_demand: true}``) notices it at a
training-step boundary within ``poll_seconds``, and captures the steps asked for once,
with the role's backend, schedule and names. ``--wait`` reports which processes accepted
it and the traces they write.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import yaml

from policy_engine.cli._common import positive_int
from policy_engine.cli.usage import UsageError
from policy_engine.language.ranks import RankSelector
from policy_engine.language.selector import SelectorError
from policy_engine.runtime.manifest import scan_manifests
from policy_engine.runtime.triggers import REQUESTS_DIR, write_request

_POLL = 0.5  # seconds between two looks at the manifests under --wait
#: --wait ends early only this long after the last new answer: processes notice a request
#: at their own pace (poll_seconds, 5 by default, at a step boundary), so the first
#: answers are not all of them.
_SETTLE = 10.0


def _step(text: str) -> int | None:
    if text == "next":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a step number or 'next', got {text!r}")
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
    parser.add_argument("--role", required=True, help="the role whose processes capture")
    parser.add_argument("--ranks", metavar="SEL",
                        help="which of them, as a policy's ranks: '0-3,8', '-1', or a "
                             "mapping such as '{tp: 0}' (default: every listening rank)")
    parser.add_argument("--steps", type=_step, default=None, metavar="N|next",
                        help="the first step to capture (default: next, the next step "
                             "each process starts)")
    parser.add_argument("--count", type=positive_int, default=1, metavar="K",
                        help="how many consecutive steps (default: 1)")
    parser.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS",
                        help="wait up to this long for the processes to answer and their "
                             "captures to close, and report them")
    parser.set_defaults(run=run)


def _ranks(text: str | None) -> Any:
    """The selector as the request carries it: checked here, so that no process has to
    refuse it."""
    if text is None:
        return None
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


def _answers(output_dir: str, rid: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The notes about request ``rid``, and its captures by id (their last line)."""
    notes: list[dict[str, Any]] = []
    captures: dict[str, Any] = {}
    ours: set[str] = set()
    for record in scan_manifests(output_dir).records:
        if record["event"] == "note" and record.get("request") == rid:
            notes.append(record)
        elif record["event"] == "open" and record.get("request") == rid:
            ours.add(record["capture"])
            captures[record["capture"]] = record
        elif record.get("capture") in ours and record["event"] in ("trace", "close"):
            if record["event"] == "trace" and record.get("path"):
                captures[record["capture"]].setdefault("paths", []).append(record["path"])
            if record["event"] == "close":
                captures[record["capture"]].update(closed=record["status"],
                                                   steps=record.get("steps"))
    return notes, captures


def _answered(note: dict[str, Any], captures: Any) -> bool:
    """Whether the process of ``note`` is done with the request: it missed it, or its
    closed captures cover every step it accepted."""
    if note.get("status") != "accepted":
        return True
    covered: set[Any] = set()
    for capture in captures:
        if (capture.get("host"), capture.get("pid")) == (note.get("host"), note.get("pid")) \
                and "closed" in capture:
            covered.update(capture.get("steps") or ())
    return set(note.get("captures") or ()) <= covered


def _wait(output_dir: str, rid: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    shown: set[tuple[str, Any]] = set()
    last_new = time.monotonic()
    while True:
        notes, captures = _answers(output_dir, rid)
        for note in notes:
            key = (note.get("host", ""), note.get("pid"))
            if key not in shown:
                shown.add(key)
                last_new = time.monotonic()
                what = note.get("message") or f"captures steps {note.get('captures')}"
                print(f"rank {note.get('rank')} (pid {note.get('pid')}): {note.get('status')}: "
                      f"{what}")
        done = bool(notes) and all(_answered(note, captures.values()) for note in notes)
        now = time.monotonic()
        if (done and now - last_new >= _SETTLE) or now >= deadline:
            break
        time.sleep(_POLL)
    for capture in captures.values():
        status = capture.get("closed", "still open")
        for path in capture.get("paths") or ["(no file)"]:
            print(f"  rank {capture.get('rank')} steps {capture.get('steps')}: {status}: {path}")
    if not notes:
        print(f"policy-engine trigger: no process answered within {seconds:g} s (processes "
              "of the role listen with triggers: {on_demand: true}, at their next "
              "training_step after poll_seconds)", file=sys.stderr)
        return 1
    return 0 if done else 1


def run(args: argparse.Namespace) -> int:
    root = args.output_dir
    if not os.path.isdir(os.path.join(root, REQUESTS_DIR)):
        raise UsageError(
            f"{root}: no process listens for requests here (no {REQUESTS_DIR}/ folder): a "
            "role listens with triggers: {on_demand: true} and creates it when it starts")
    ranks = _ranks(args.ranks)
    try:
        request = write_request(root, role=args.role, ranks=ranks, step=args.steps,
                                count=args.count)
    except OSError as err:
        raise UsageError(f"{root}: cannot write the request: {err.strerror or err}") from None
    steps = "the next step" if args.steps is None else f"step {args.steps}"
    more = f" and the {args.count - 1} after it" if args.count > 1 else ""
    print(f"request {request['id']}: role {args.role!r}, ranks {ranks or 'all listening'}, "
          f"{steps}{more}")
    if args.wait:
        return _wait(root, request["id"], args.wait)
    return 0
