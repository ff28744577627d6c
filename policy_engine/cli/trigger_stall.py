"""``policy-engine trigger OUTPUT_DIR --stall``: ask every process that watches for stalls
(``triggers: {stall: ...}``) to write its stall record now, whatever its role.

On the job's store (or Ray actor) the ask is a new stall episode (the key every watching
process reads at its next poll); ``--wait`` then reads their answers there and names the
processes registered that did not answer. Without a store it is a request file under
``OUTPUT_DIR/triggers/`` (``why: stall``, role ``*``). Either way the records appear under
``OUTPUT_DIR/stalls/``, and ``policy-engine analyze OUTPUT_DIR`` reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from policy_engine.cli import trigger_store
from policy_engine.cli.usage import UsageError
from policy_engine.files.publish import UnsafePathError, open_folder
from policy_engine.runtime.triggers.channel import JobChannel
from policy_engine.runtime.triggers.requests import EVERY_ROLE, REQUESTS_DIR, write_request
from policy_engine.runtime.triggers.stall_watch import answers, members, post_episode

_POLL = 0.5


def run(args: argparse.Namespace) -> int:
    root = args.output_dir
    found = trigger_store.find_channel(root, args.store, EVERY_ROLE)
    if isinstance(found, tuple):
        return _over_store(found, args.wait)
    try:
        os.close(open_folder(root, REQUESTS_DIR, create=False))
    except FileNotFoundError:
        raise UsageError(
            f"{root}: no process listens for requests here (no {REQUESTS_DIR}/ folder): a "
            "role watches for stalls with triggers: {stall: ...} and creates it when it "
            "starts") from None
    except OSError as err:
        raise UsageError(f"refused: {err}" if isinstance(err, UnsafePathError) else
                         f"{root}: cannot open {REQUESTS_DIR}/: {err.strerror or err}") \
            from None
    if isinstance(found, trigger_store.Unanswered):
        print(f"policy-engine trigger: {found.fell_back(root)}", file=sys.stderr, flush=True)
    try:
        request = write_request(root, role=EVERY_ROLE, ranks=None, step=None, count=1,
                                why="stall")
    except UnsafePathError as err:
        raise UsageError(f"refused: {err}") from None
    except OSError as err:
        raise UsageError(f"{root}: cannot write the request: {err.strerror or err}") from None
    print(f"request {request['id']}: every process that watches for stalls writes its stall "
          f"record under {root}/stalls/ at its next poll; policy-engine analyze {root} "
          "reads them", flush=True)
    return 0


def _over_store(found: tuple[str, JobChannel], wait: float) -> int:
    where, channel = found
    try:
        listed = members(channel)
        if not listed:
            raise UsageError(f"no process watches for stalls on the job's store at {where} "
                             "(a role watches with triggers: {stall: {after: ...}})")
        episode, _began = post_episode(channel, "hand", None, None, None)
    except UsageError:
        raise
    except Exception as err:
        raise UsageError(f"the job's store at {where} failed: "
                         f"{trigger_store.first_line(err)}") from None
    if episode is None:
        raise UsageError(f"the job's store at {where}: another ask kept replacing this one")
    print(f"stall episode {episode.id}: asked {len(listed)} watching process(es) through the "
          f"job's store at {where}", flush=True)
    if not wait:
        return 0
    deadline = time.monotonic() + wait
    got: dict[int, Any] = {}
    while True:
        try:
            found_now = answers(channel, episode.id, len(listed))
        except Exception as err:
            print(f"policy-engine trigger: error: the job's store at {where} stopped "
                  f"answering: {trigger_store.first_line(err)}", file=sys.stderr)
            return 1
        for slot, answer in sorted(found_now.items()):
            if slot not in got:
                got[slot] = answer
                print(f"rank {answer.get('rank')} (pid {answer.get('pid')}): record "
                      f"{answer.get('record')}", flush=True)
        if len(got) >= len(listed) or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    silent = [m for s, m in enumerate(listed) if s not in got]
    if silent:
        named = ", ".join(f"rank {m.get('rank')} (pid {m.get('pid')})" if isinstance(m, dict)
                          else "?" for m in silent[:16])
        print(f"policy-engine trigger: {len(silent)} of the {len(listed)} watching processes "
              f"did not answer within {wait:g} s: {named}", file=sys.stderr)
        return 1
    return 0
