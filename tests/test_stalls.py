"""The stall records' reading side (policy_engine.analysis.stalls and stall_record): records
as the runtime writes them read back the same; hostile files are refused one by one with
what is wrong, never failing the answer; episodes group the records of one stall; the
answer names who waits in which call, who never reached it and where, who did not answer,
and a stall that cleared; analyze answers a folder that holds stall records only."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest

from policy_engine.analysis import analyze
from policy_engine.analysis.stall_record import (
    MAX_FILE_BYTES,
    MAX_FRAMES,
    MAX_TEXT,
    MAX_THREADS,
    Call,
    Frame,
    Group,
    Member,
    RollCall,
    StallRecord,
    Thread,
)
from policy_engine.analysis.stalls import read_stalls, stalls_text
from policy_engine.runtime.process import stall_report

T0 = 1_800_000_000.0


def frame(line: int, code: str, own: bool = True, file: str = "train.py",
          function: str = "main") -> Frame:
    return Frame(file, line, function, code, own)


def record(rank: int, *, call: Call | None, at: Frame, world: int = 4, time: float = T0,
           pid: int | None = None, why: str = "stall", groups: tuple[Group, ...] = (),
           in_step: bool = True) -> StallRecord:
    inner = (Frame("/torch/distributed/distributed_c10d.py", 3245, "all_reduce",
                   "work.wait()", False),) if call is not None and call.returned is False \
        else ()
    return StallRecord(
        why=why, role="trainer", rank=rank, world=world, pid=pid or 1000 + rank, host="h",
        time=time + rank * 0.01, episode=None, asked_by=None, step=5, in_step=in_step,
        running=5.2, limit=5.0, limit_said="5 s", region=(), inner_step=0, capture=None,
        collective=call, collectives="test", calls=(), groups=groups or (
            Group("0", "default_pg", f"0-{world - 1}", 5, 4),),
        threads=(Thread("MainThread", 1, True, False, (*inner, at)),))


def waiting(seq: int = 5, group: str = "0") -> Call:
    return Call("all_reduce", False, "flight_recorder", group, "default_pg", seq, T0, 1)


def returned(seq: int = 4, group: str = "0") -> Call:
    return Call("all_reduce", True, "flight_recorder", group, "default_pg", seq, T0, 1)


def write(out: Path, *found: Any) -> None:
    for item in found:
        if isinstance(item, StallRecord):
            stall_report.write_record(str(out), item)
        else:
            stall_report.write_roll_call(str(out), item)


def hang(out: Path) -> None:
    """Ranks 0-2 wait in call 5 at line 31; rank 3 sleeps at line 28."""
    write(out, *(record(r, call=waiting(), at=frame(31, "dist.all_reduce(t)"))
                 for r in range(3)),
          record(3, call=returned(), at=frame(28, "time.sleep(600)")))


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="trainer-thread")
    thread.start()
    try:
        made = stall_report.record(why="hand", identity={"role": "a", "rank": 2, "world": 4},
                                   training=thread.ident, position={"step": 7, "in_step": True})
    finally:
        stop.set()
        thread.join()
    path = stall_report.write_record(str(tmp_path), made)
    found = read_stalls(str(tmp_path))
    assert found is not None and found.problems == ()
    [read] = found.episodes[0].records
    assert read == StallRecord.from_json(json.loads(Path(path).read_text()),
                                         os.path.basename(path))
    assert read.rank == 2 and read.step == 7
    trainer = read.training()
    assert trainer is not None and trainer.name == "trainer-thread"
    assert trainer.frames[0].function.endswith("wait") and not trainer.frames[0].own
    assert read.collectives == "torch.distributed is not initialised in this process"


def test_a_record_is_bounded_however_many_threads_and_frames(tmp_path: Path) -> None:
    long = "\u00e9" * MAX_TEXT  # escaped in JSON: six bytes a character
    deep = tuple(Frame(long, 1, long, long, True) for _ in range(MAX_FRAMES))
    threads = tuple(Thread(long, i, i == 0, False, deep) for i in range(MAX_THREADS))
    huge = attrs.evolve(record(0, call=None, at=frame(1, "x")), threads=threads)
    path = stall_report.write_record(str(tmp_path), huge)
    assert len(json.dumps(huge.to_json())) > MAX_FILE_BYTES  # it would not fit whole
    assert os.path.getsize(path) <= MAX_FILE_BYTES
    [read] = read_stalls(str(tmp_path)).episodes[0].records  # type: ignore[union-attr]
    assert read.threads[0].frames == deep  # the training thread's stack stays whole
    assert all(len(t.frames) < MAX_FRAMES for t in read.threads[1:])


@pytest.mark.parametrize(("content", "said"), [
    (b"{", "not JSON"),
    (b'{"kind": "policy_engine.stall", "version": 1, "time": NaN}', "NaN is not a JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'{"kind": "other", "version": 1}', "kind: expected 'policy_engine.stall'"),
    (b'{"kind": "policy_engine.stall", "version": 9}', "written by a newer policy-engine"),
    (b'{"kind": "policy_engine.stall", "version": 1, "why": "stall", "role": "r", '
     b'"rank": -1}', "rank: expected a rank"),
    (json.dumps({**record(0, call=None, at=frame(1, "x")).to_json(),
                 "threads": [{"name": "t", "ident": 1, "training": True,
                              "frames": [{"file": "f", "line": "1", "function": "g"}]}]}
                ).encode(), "threads[0].frames[0].line: expected a line number"),
])
def test_a_file_that_is_no_record_is_a_problem_named(tmp_path: Path, content: bytes,
                                                     said: str) -> None:
    hang(tmp_path)
    (tmp_path / "stalls" / "planted.json").write_bytes(content)
    found = read_stalls(str(tmp_path))
    assert found is not None
    [problem] = found.problems
    assert problem.startswith("stalls/planted.json: ") and said in problem
    assert len(found.episodes[0].records) == 4  # the others are read as ever


def test_links_fifos_and_oversized_files_are_not_read(tmp_path: Path) -> None:
    hang(tmp_path)
    stalls = tmp_path / "stalls"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(record(9, call=None, at=frame(1, "x")).to_json()))
    (stalls / "link.json").symlink_to(secret)
    os.mkfifo(stalls / "fifo.json")
    (stalls / "big.json").write_bytes(b" " * (MAX_FILE_BYTES + 1))
    found = read_stalls(str(tmp_path))
    assert found is not None
    assert sorted(found.problems) == [
        f"stalls/big.json: larger than {MAX_FILE_BYTES} bytes",
        "stalls/fifo.json: not a regular file",
        "stalls/link.json: a symbolic link (not followed)"]
    assert [r.rank for r in found.episodes[0].records] == [0, 1, 2, 3]


def test_the_answer_names_who_waits_where_and_who_never_came(tmp_path: Path) -> None:
    hang(tmp_path)
    found = read_stalls(str(tmp_path))
    assert found is not None
    [episode] = found.to_json()["episodes"]
    assert episode["status"] == "stalled" and episode["no_record"] == []
    [call] = episode["collectives"]
    assert (call["name"], call["group"], call["seq"], call["ranks"]) == \
        ("all_reduce", "0", 5, [0, 1, 2])
    assert [(w["file"], w["line"], w["ranks"]) for w in call["where"]] == \
        [("train.py", 31, [0, 1, 2])]
    [late] = call["not_reached"]
    assert late["rank"] == 3 and late["where"]["line"] == 28
    assert late["last"]["seq"] == 4
    text = "\n".join(stalls_text(found.to_json()))
    assert "ranks 0-2 wait in all_reduce (group 0 'default_pg', call 5) at train.py:31 in " \
           "main: dist.all_reduce(t)" in text
    assert "rank 3 never reached it (its last call there: 4, returned): at train.py:28 in " \
           "main: time.sleep(600)" in text


def test_a_silent_rank_is_named_and_a_missing_one_said(tmp_path: Path) -> None:
    write(tmp_path, *(record(r, call=waiting(), at=frame(31, "dist.all_reduce(t)"), world=5)
                      for r in (0, 1, 3)),
          RollCall("ep1", 0, T0 + 8, 8.0, "store",
                   tuple(Member(r, 1000 + r, "h", r != 2) for r in range(4))))
    found = read_stalls(str(tmp_path))
    assert found is not None
    [episode] = found.to_json()["episodes"]
    assert episode["not_answering"] == [2] and episode["no_record"] == [4]
    assert episode["collectives"][0]["not_reached"] == []
    text = "\n".join(stalls_text(found.to_json()))
    assert "NOT ANSWERING: rank(s) 2 (no answer within 8 s over the job's store)" in text
    assert "no record from rank(s) 4" in text


def test_only_the_members_of_the_group_are_expected_in_its_call(tmp_path: Path) -> None:
    pair = (Group("1", "tp", "0-1", 3, 2), Group("0", "default_pg", "0-3", 2, 2))
    write(tmp_path, record(0, call=waiting(3, "1"), at=frame(40, "all_reduce(x, group=tp)"),
                           groups=pair),
          record(1, call=returned(2, "1"), at=frame(12, "load()"), groups=pair),
          *(record(r, call=returned(2, "0"), at=frame(50, "x"), groups=pair) for r in (2, 3)))
    found = read_stalls(str(tmp_path))
    assert found is not None
    [call] = found.to_json()["episodes"][0]["collectives"]
    assert call["group"] == "1" and call["members"] == "0-1"
    assert [a["rank"] for a in call["not_reached"]] == [1]


def test_a_process_that_stalls_twice_makes_two_episodes(tmp_path: Path) -> None:
    write(tmp_path, record(0, call=None, at=frame(1, "a"), world=1, pid=7),
          record(0, call=None, at=frame(2, "b"), world=1, pid=7, time=T0 + 30),
          record(0, call=None, at=frame(3, "c"), world=1, pid=7, time=T0 + 3600))
    found = read_stalls(str(tmp_path))
    assert found is not None
    assert [[r.time for r in e.records] for e in found.episodes] == \
        [[T0 + 3600], [T0 + 30], [T0]]


def test_a_stall_whose_steps_ended_is_cleared(tmp_path: Path) -> None:
    made = record(0, call=None, at=frame(9, "slow()"), world=1)
    path = stall_report.write_record(str(tmp_path), made)
    stall_report.write_cleared(str(tmp_path), path, 5, 8.25)
    found = read_stalls(str(tmp_path))
    assert found is not None
    [episode] = found.to_json()["episodes"]
    assert episode["status"] == "cleared" and episode["ranks"][0]["cleared"] == 8.25
    assert "a slow step, not a hang: cleared rank 0 after 8.2 s" in stalls_text(
        found.to_json())[1]


def test_analyze_answers_a_folder_of_stall_records_alone(tmp_path: Path) -> None:
    hang(tmp_path)
    doc = analyze(str(tmp_path))
    assert doc.to_json()["windows"] == []
    stalls = doc.to_json()["stalls"]
    assert stalls["episodes"][0]["collectives"][0]["ranks"] == [0, 1, 2]


def test_a_record_in_its_step_that_names_none_is_read_beside_the_others(
        tmp_path: Path) -> None:
    """One record says it is in its step but names no step (null), among records at step 5:
    the answer shows step 5 and says the episode, nothing raises."""
    write(tmp_path, *(record(r, call=waiting(), at=frame(31, "dist.all_reduce(t)"))
                      for r in range(3)),
          attrs.evolve(record(3, call=returned(), at=frame(28, "time.sleep(600)")),
                       step=None))
    found = read_stalls(str(tmp_path))
    assert found is not None
    text = "\n".join(stalls_text(found.to_json()))
    assert "== STALL at step 5 (past 5 s): 4 record(s) of 4 rank(s)" in text
