"""files/: the output layout's names, and the publisher's helpers for folders and files
that other tools write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy_engine.files import layout
from policy_engine.files.publish import (
    UnsafePathError,
    make_tool_folder,
    moved_from,
    open_temp,
    rename_folder,
    write_atomic,
)


def test_temporary_names_are_hidden_found_and_keep_their_ending(tmp_path: Path) -> None:
    name = layout.temp_name(".pickle")
    assert name.startswith(".") and name.endswith(".pickle")
    assert layout.is_temp_name(name) and layout.temp_pid(name) == os.getpid()
    assert name != layout.temp_name(".pickle")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / name).write_bytes(b"")
    (tmp_path / "a" / "trace.pickle").write_bytes(b"")
    assert layout.find_leftovers(str(tmp_path)) == [os.path.join("a", name)]


def test_shortening_keeps_long_names_apart() -> None:
    one, two = "x" * 300 + "1", "x" * 300 + "2"
    assert len(layout.shorten(one).encode()) == layout.MAX_COMPONENT_BYTES
    assert layout.shorten(one) != layout.shorten(two)
    assert layout.shorten("short") == "short"


def test_a_tool_folder_below_output_dir_is_made_without_following_links(
        tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    make_tool_folder(str(out), str(out / "actor" / ".engine"))
    assert (out / "actor" / ".engine").is_dir()
    (out / "planted").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        make_tool_folder(str(out), str(out / "planted" / "x"))
    assert list(elsewhere.iterdir()) == []
    make_tool_folder(str(out), str(tmp_path / "chosen" / "by" / "user"))
    assert (tmp_path / "chosen" / "by" / "user").is_dir()


def test_another_tools_file_is_moved_in_whole(tmp_path: Path) -> None:
    src = tmp_path / "engine.pt.trace.json.gz"
    src.write_bytes(b"trace")
    path, size = write_atomic(str(tmp_path / "out"), "actor/step5", ".pt.trace.json.gz",
                              moved_from(str(src)))
    assert Path(path).read_bytes() == b"trace" and size == 5 and not src.exists()


def test_a_folder_is_renamed_only_onto_a_free_name(tmp_path: Path) -> None:
    tool, taken = tmp_path / "tool_123_ascend_pt", tmp_path / "step5_123_ascend_pt"
    tool.mkdir()
    (tool / "data").write_text("x")
    taken.mkdir()
    (taken / "other").write_text("y")
    assert rename_folder(str(tool), str(taken)) is False
    assert (tool / "data").exists() and (taken / "other").exists()
    target = tmp_path / "step6_123_ascend_pt"
    assert rename_folder(str(tool), str(target)) is True
    assert (target / "data").read_text() == "x" and not tool.exists()


def test_a_writer_never_writes_into_what_is_swapped_in_for_its_temporary_file(
        tmp_path: Path) -> None:
    """A FIFO put in place of the file a writer was handed is refused at once (never
    waited on); a link is not followed; a regular file is written."""
    fifo, link, plain = tmp_path / "fifo", tmp_path / "link", tmp_path / "plain"
    os.mkfifo(fifo)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_temp(str(fifo))
    (tmp_path / "victim").write_text("kept")
    link.symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        open_temp(str(link), text=True)
    assert (tmp_path / "victim").read_text() == "kept"
    plain.write_text("old and longer")
    with open_temp(str(plain), text=True) as f:
        f.write("new")
    assert plain.read_text() == "new"
