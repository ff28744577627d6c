"""files/publish.py: files are written whole or not at all, never outside output_dir."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from policy_engine.files import layout as output_layout
from policy_engine.files import publish as output
from policy_engine.files.layout import find_leftovers
from policy_engine.files.publish import UnsafePathError, write_atomic
from policy_engine.runtime.process import manifest


def text_writer(content: str) -> Any:
    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    return write


def tree(root: Path) -> list[str]:
    """Every entry under root (links not followed), relative, sorted."""
    found = []
    for here, dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(here, n), root) for n in dirs + files]
    return sorted(found)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder that must stay untouched; victim.txt is a file someone could want destroyed."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim.txt").write_text("precious")
    return folder


def assert_untouched(outside: Path) -> None:
    assert tree(outside) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "precious"


def test_writes_the_file_whole_under_its_name(out: Path) -> None:
    path, size = write_atomic(str(out), "a/b/trace", ".json.gz", text_writer("hello"))
    assert path == str(out / "a" / "b" / "trace.json.gz")
    assert size == 5 and Path(path).read_text() == "hello"
    assert tree(out) == ["a", "a/b", "a/b/trace.json.gz"]


def test_the_writer_sees_a_hidden_temporary_path_with_the_extension(out: Path) -> None:
    seen: list[str] = []

    def writer(path: str) -> None:
        seen.append(path)
        Path(path).write_text("x")

    write_atomic(str(out), "t", ".pt.trace.json.gz", writer)
    name = os.path.basename(seen[0])
    assert os.path.dirname(seen[0]) == str(out)
    assert name.startswith(f".policy-engine-{os.getpid()}-")
    assert name.endswith(".tmp.pt.trace.json.gz")
    assert output_layout.is_temp_name(name) and output_layout.temp_pid(name) == os.getpid()
    write_atomic(str(out), "u", ".pt.trace.json.gz", writer)
    assert seen[1] != seen[0]  # unpredictable, not pid + thread id


def test_a_clash_gets_a_numbered_suffix_and_a_warning(out: Path, caplog: Any) -> None:
    first, _ = write_atomic(str(out), "t", ".json", text_writer("one"))
    with caplog.at_level(logging.WARNING, logger="policy_engine"):
        second, _ = write_atomic(str(out), "t", ".json", text_writer("two"))
        third, _ = write_atomic(str(out), "t", ".json", text_writer("three"))
    assert (second, third) == (str(out / "t.1.json"), str(out / "t.2.json"))
    assert [Path(p).read_text() for p in (first, second, third)] == ["one", "two", "three"]
    assert [r.getMessage() for r in caplog.records] == [
        f"policy-engine: {first} already exists; this trace is {second}",
        f"policy-engine: {first} already exists; this trace is {third}"]


def test_threads_writing_one_name_never_overwrite(out: Path) -> None:
    paths: list[str] = []

    def work(n: int) -> None:
        paths.append(write_atomic(str(out), "t", ".txt", text_writer(str(n)))[0])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 8
    assert sorted(Path(p).read_text() for p in paths) == [str(n) for n in range(8)]
    assert find_leftovers(str(out)) == []


def test_a_long_name_is_shortened_with_room_for_the_suffix(out: Path) -> None:
    stem = "x" * 300
    path, _ = write_atomic(str(out), stem, ".pt.trace.json.gz", text_writer("a"))
    again, _ = write_atomic(str(out), stem, ".pt.trace.json.gz", text_writer("b"))
    assert len(os.path.basename(path).encode()) <= 255
    assert len(os.path.basename(again).encode()) <= 255 and again != path


class Unusable(Exception):
    pass


def refuse(path: str) -> None:
    raise Unusable(f"{path} is empty")


@pytest.mark.parametrize("case", ["writer raises", "check raises"])
def test_a_failure_leaves_nothing_behind(out: Path, case: str) -> None:
    def writer(path: str) -> None:
        Path(path).write_text("half")
        if case == "writer raises":
            raise Unusable("export failed")

    with pytest.raises(Unusable):
        write_atomic(str(out), "sub/t", ".json", writer, check=refuse)
    assert tree(out) == ["sub"]


def test_check_sees_the_written_file(out: Path) -> None:
    sizes: list[int] = []
    write_atomic(str(out), "t", ".json", text_writer("abc"),
                 check=lambda p: sizes.append(os.path.getsize(p)))
    assert sizes == [3]


@pytest.mark.parametrize("err", [errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK])
def test_without_hard_links_the_name_is_claimed_then_replaced(
        out: Path, monkeypatch: Any, caplog: Any, err: int) -> None:
    def no_link(*args: Any, **kwargs: Any) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "link", no_link)
    first, size = write_atomic(str(out), "t", ".json", text_writer("one"))
    with caplog.at_level(logging.WARNING, logger="policy_engine"):
        second, _ = write_atomic(str(out), "t", ".json", text_writer("two"))
    assert (first, size, second) == (str(out / "t.json"), 3, str(out / "t.1.json"))
    assert Path(first).read_text() == "one" and Path(second).read_text() == "two"
    assert "already exists" in caplog.text
    assert tree(out) == ["t.1.json", "t.json"]


def test_a_failing_publish_without_hard_links_leaves_nothing(out: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EPERM, "no")))

    def broken_replace(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="I/O error"):
        write_atomic(str(out), "t", ".json", text_writer("one"))
    assert tree(out) == []


def test_other_link_errors_propagate_and_leave_nothing(out: Path, monkeypatch: Any) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(str(out), "t", ".json", text_writer("one"))
    assert tree(out) == []


# -- planted links -----------------------------------------------------------------------

def test_a_link_planted_as_a_sub_folder_is_refused(out: Path, outside: Path) -> None:
    out.mkdir()
    (out / "run1").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"run1 is a symbolic link"):
        write_atomic(str(out), "run1/victim", ".txt", text_writer("owned"))
    with pytest.raises(UnsafePathError, match=r"run1 is a symbolic link"):
        write_atomic(str(out), "run1/deeper/t", ".txt", text_writer("owned"))
    assert_untouched(outside)


def test_a_file_where_a_folder_should_be_is_refused(out: Path) -> None:
    out.mkdir()
    (out / "run1").write_text("")
    with pytest.raises(UnsafePathError, match=r"run1 is not a folder"):
        write_atomic(str(out), "run1/t", ".txt", text_writer("x"))


def test_a_link_at_the_old_predictable_temporary_name_is_not_followed(
        out: Path, outside: Path) -> None:
    out.mkdir()
    ext = ".pt.trace.json"
    old = f".policy-engine-{os.getpid()}-{threading.get_ident()}.tmp{ext}"
    (out / old).symlink_to(outside / "victim.txt")
    path, _ = write_atomic(str(out), "t", ext, text_writer("trace"))
    assert Path(path).read_text() == "trace" and not Path(path).is_symlink()
    assert_untouched(outside)


def test_a_link_at_the_final_name_is_never_replaced_nor_followed(
        out: Path, outside: Path) -> None:
    out.mkdir()
    (out / "t.json").symlink_to(outside / "victim.txt")
    path, _ = write_atomic(str(out), "t", ".json", text_writer("trace"))
    assert path == str(out / "t.1.json") and Path(path).read_text() == "trace"
    assert (out / "t.json").is_symlink()
    assert_untouched(outside)


def test_a_writer_whose_file_was_swapped_for_a_link_publishes_nothing(
        out: Path, outside: Path) -> None:
    def writer(path: str) -> None:
        os.unlink(path)  # what another user could do to a file they can see
        os.symlink(outside / "victim.txt", path)

    with pytest.raises(UnsafePathError):
        write_atomic(str(out), "t", ".json", writer)
    assert tree(out) == []
    assert_untouched(outside)


def test_a_link_planted_at_manifests_is_refused(out: Path, outside: Path) -> None:
    out.mkdir()
    (out / "manifests").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"manifests is a symbolic link"):
        manifest.append(str(out), {"event": "open", "capture": "1"})
    assert_untouched(outside)


def test_a_link_planted_at_the_manifest_file_is_refused(out: Path, outside: Path) -> None:
    (out / "manifests").mkdir(parents=True)
    Path(manifest.manifest_path(str(out))).symlink_to(outside / "victim.txt")
    with pytest.raises(OSError) as err:
        manifest.append(str(out), {"event": "open", "capture": "1"})
    assert err.value.errno == errno.ELOOP
    assert_untouched(outside)


def test_output_dir_itself_may_be_a_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "profiles").symlink_to(outside)
    path, _ = write_atomic(str(tmp_path / "profiles"), "sub/t", ".txt", text_writer("x"))
    assert (outside / "sub" / "t.txt").read_text() == "x"
    assert path == str(tmp_path / "profiles" / "sub" / "t.txt")


@pytest.mark.parametrize("stem", ["../t", "a/../../t", "/etc/t", "a/.."])
def test_names_that_climb_out_are_refused(out: Path, stem: str) -> None:
    with pytest.raises((UnsafePathError, ValueError)):
        write_atomic(str(out), stem, ".txt", text_writer("x"))
    assert not (out.parent / "t.txt").exists()


def test_make_folders_creates_safely_and_refuses_links(out: Path, outside: Path) -> None:
    assert output.make_folders(str(out), "a/b_ascend_pt") == str(out / "a" / "b_ascend_pt")
    assert (out / "a" / "b_ascend_pt").is_dir()
    (out / "link").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        output.make_folders(str(out), "link/c")
    assert_untouched(outside)


def test_leftovers_are_found_recursively(out: Path) -> None:
    (out / "sub").mkdir(parents=True)
    (out / ".policy-engine-12-abc.tmp.json").write_text("")
    (out / "sub" / ".policy-engine-13-140.tmp.pt.trace.json.gz").write_text("")
    (out / ".hidden").write_text("")
    (out / "t.json").write_text("")
    assert find_leftovers(str(out)) == [
        ".policy-engine-12-abc.tmp.json",
        os.path.join("sub", ".policy-engine-13-140.tmp.pt.trace.json.gz")]


# -- full disks ---------------------------------------------------------------------------

def derived_writer(path: str) -> None:
    """Like kineto: write beside the temporary file (its name plus a suffix), swallow the
    write error and report only that the expected file is missing."""
    try:
        with open(path + ".json.tmp", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (64 << 10))
    except OSError:
        pass
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", path + ".json")


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A real 1 MiB file system (tmpfs; needs the right to mount, else the test skips)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_reported_as_full_and_leaves_no_temporary_file(
        small_disk: Path) -> None:
    with pytest.raises(output.DiskFullError) as caught:
        write_atomic(str(small_disk), "run/t", ".json", text_writer("x" * (4 << 20)))
    assert caught.value.errno == errno.ENOSPC
    message = str(caught.value)
    assert f"disk full: {small_disk / 'run'} has no room for t.json" in message
    assert "No space left on device" in message
    assert tree(small_disk) == ["run"] and find_leftovers(str(small_disk)) == []


def test_a_writer_that_hides_the_full_disk_is_still_reported_as_full(
        small_disk: Path) -> None:
    with pytest.raises(output.DiskFullError, match=r"disk full: .* \(no space left on device"):
        write_atomic(str(small_disk), "t", ".pt.trace.json.gz", derived_writer)
    assert tree(small_disk) == []  # the file it wrote beside the temporary one too


def test_a_full_quota_is_reported_and_derived_files_are_removed(out: Path) -> None:
    """Without a real full disk: a writer that fails with EDQUOT after writing beside
    the temporary file (a quota cannot be set up here)."""
    def writer(path: str) -> None:
        Path(path + ".json").write_text("half")
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    with pytest.raises(output.DiskFullError) as caught:
        write_atomic(str(out), "sub/t", ".json", writer)
    assert caught.value.errno == errno.EDQUOT
    assert str(caught.value).startswith(
        f"[Errno {errno.EDQUOT}] disk full: {out / 'sub'} has no room for t.json "
        "(quota exceeded")
    assert tree(out) == ["sub"]


def test_a_writer_failing_on_a_disk_with_room_keeps_its_own_error(out: Path) -> None:
    def writer(path: str) -> None:
        Path(path + ".part").write_text("half")
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path + ".x")

    with pytest.raises(FileNotFoundError):
        write_atomic(str(out), "t", ".json", writer)
    assert tree(out) == []
