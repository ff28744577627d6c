"""The one file publisher: files written whole or not at all, never over another file,
never outside their folder (the per-process manifests, appended to a line at a time, are
the one kind of file written elsewhere: policy_engine.runtime.process.manifest).

``output_dir`` is shared: several ranks, jobs or users may write into it, and any of them
can plant a symbolic link where the engine is about to write. So everything below
``output_dir`` is reached through folder descriptors, one path component at a time, with
``O_NOFOLLOW``: a link is refused, never followed. ``output_dir`` itself (and what lies
above it) is the user's choice and may be a link.

A file is written under an unpredictable temporary name in its final folder, and gets its
final name only when whole, by a hard link that cannot replace an existing file. A crash
leaves at most a hidden temporary file, which
:func:`~policy_engine.files.layout.find_leftovers` finds (``policy-engine traces`` lists
them); never a final name with nothing or half a file in it. Tools given a file name by
the user (``report -o``, ``merge -o``) write through :func:`publish`, which replaces an
existing file only when asked (``--force``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any

from policy_engine.files.interrupt import stopped_cleanly
from policy_engine.files.layout import MAX_COMPONENT_BYTES, shorten, temp_name

log = logging.getLogger("policy_engine")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# link() errors that mean "this file system has no hard links", not "this name is bad".
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS})
# fsync() errors that mean "not supported here" (some network and FUSE file systems).
_NO_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF})


class UnsafePathError(OSError):
    """A path under ``output_dir`` is a symbolic link or not a folder: refused, not followed."""


def _components(rel: str) -> list[str]:
    """The folders of a relative name (``/``-separated), refusing anything that climbs out."""
    if rel.startswith("/"):
        raise UnsafePathError(f"{rel!r} is an absolute path; names are relative to output_dir")
    comps = [c for c in rel.split("/") if c]
    for comp in comps:
        if comp in (".", ".."):
            raise UnsafePathError(f"{rel!r}: {comp!r} would leave output_dir")
    return comps


def _refuse(parent: int, comp: str, shown: str) -> UnsafePathError:
    try:
        mode = os.lstat(comp, dir_fd=parent).st_mode
    except OSError:
        mode = 0
    what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
    return UnsafePathError(
        f"{shown} is {what}; policy-engine writes only into real folders under output_dir "
        "(remove it, or choose another output_dir)")


def _enter(parent: int, comp: str, shown: str, create: bool) -> int:
    """Open (creating it if asked) folder ``comp`` under ``parent``, never through a link."""
    for _ in range(100):  # a folder removed between mkdir and open is made again
        try:
            return os.open(comp, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as err:
            if err.errno in (errno.ENOTDIR, errno.ELOOP):
                raise _refuse(parent, comp, shown) from None
            raise
        with contextlib.suppress(FileExistsError):  # another rank made it first
            os.mkdir(comp, 0o777, dir_fd=parent)
    raise OSError(errno.EAGAIN, f"{shown} keeps disappearing")


def open_folder(output_dir: str, rel: str = "", *, create: bool = True) -> int:
    """A descriptor of the folder ``output_dir/rel``; the caller closes it.

    ``output_dir`` is created like ``os.makedirs`` (it may be or sit under a link). The
    folders of ``rel`` are created (``create``) and entered one at a time without following
    links: a component that is a link or not a folder raises :class:`UnsafePathError`
    naming it.
    """
    if create:
        os.makedirs(output_dir, exist_ok=True)
    fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = output_dir
    try:
        for comp in _components(rel):
            shown = os.path.join(shown, comp)
            inner = _enter(fd, comp, shown, create)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def folder(output_dir: str, rel: str = "", *, create: bool = True) -> Iterator[int]:
    """:func:`open_folder` as a context manager that closes the descriptor."""
    fd = open_folder(output_dir, rel, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def make_folders(output_dir: str, rel: str) -> str:
    """Create the folders ``output_dir/rel`` safely (see :func:`open_folder`); their path.

    For tools that are given a folder path and write into it themselves.
    """
    with folder(output_dir, rel):
        pass
    return os.path.join(output_dir, *_components(rel))


def make_tool_folder(output_dir: str, path: str) -> None:
    """Create the folder ``path`` a tool writes into: below ``output_dir`` safely (see
    :func:`make_folders`); elsewhere (a folder the user named outside it, their choice as
    ``output_dir`` is) as ``os.makedirs`` does."""
    rel = os.path.relpath(path, output_dir) if output_dir else path
    if output_dir and rel != ".." and not rel.startswith("../"):
        make_folders(output_dir, "" if rel == "." else rel)
    else:
        os.makedirs(path, exist_ok=True)


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _NO_FSYNC:
            raise


def write_atomic(output_dir: str, stem: str, ext: str, writer: Callable[[str], Any], *,
                 check: Callable[[str], Any] | None = None) -> tuple[str, int]:
    """Write ``output_dir/stem+ext`` whole, or nothing; return its path and size.

    ``stem`` may hold ``/`` (sub-folders, created safely). Its last component is shortened
    to leave room for ``ext`` and a clash suffix. ``writer(temp_path)`` writes the file by
    path, to a temporary name in the final folder that keeps ``ext``; ``check(temp_path)``,
    when given, raises to say the result is unusable. The file is then synced and published
    under its final name, which is never an existing file: a clash takes ``stem.1+ext``,
    ``stem.2+ext``... with a warning. On any error nothing is left under the final name
    and the temporary file is removed, with any file the writer derived from its name; the
    error propagates, as :class:`DiskFullError` naming the folder when the disk (or quota)
    was full.
    """
    rel_folder, base = posixpath.split(stem)
    if not base or base in (".", ".."):
        raise ValueError(f"{stem!r} does not name a file")
    base = shorten(base, MAX_COMPONENT_BYTES - len(ext.encode()) - 4)
    folder_path = os.path.join(output_dir, *_components(rel_folder))
    with folder(output_dir, rel_folder) as dir_fd:
        temp = temp_name(ext)
        try:
            os.close(os.open(temp, _NEW_FILE_FLAGS, 0o644, dir_fd=dir_fd))
            writer(os.path.join(folder_path, temp))
            if check is not None:
                check(os.path.join(folder_path, temp))
            info = _sync_written(dir_fd, temp, os.path.join(folder_path, temp))
            name = _publish(dir_fd, temp, base, ext, info)
        except BaseException as err:
            full = _disk_full(dir_fd, err, folder_path, base + ext)
            _remove_temps(dir_fd, temp)
            if full is not None:
                raise full from err
            raise
        _remove_temps(dir_fd, temp, derived=False)
    final = os.path.join(folder_path, name)
    if name != base + ext:
        log.warning("policy-engine: %s already exists; this trace is %s",
                    os.path.join(folder_path, base + ext), final)
    return final, info.st_size


# O_NONBLOCK and O_NOCTTY: a FIFO or terminal swapped in is refused, not waited on or adopted.
_WRITE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                | os.O_NOCTTY | os.O_CLOEXEC)


def open_temp(path: str, *, text: bool = False) -> IO[Any]:
    """The temporary file :func:`write_atomic` hands a writer, opened for writing (emptied,
    or made; UTF-8 text when ``text``). Its folder is shared, and anyone may swap something
    in under its name: a link is refused (OSError), and anything but a regular file too
    (:class:`UnsafePathError`), without waiting for the reader of a FIFO."""
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):  # a link: open() refuses it
            raise UnsafePathError(f"{path} was replaced by something not a regular file")
    fd = os.open(path, _WRITE_FLAGS, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{path} was replaced by something not a regular file")
        return os.fdopen(fd, "w", encoding="utf-8") if text else os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


class DiskFullError(OSError):
    """The output folder's file system (or the user's quota there) has no room left."""


# Free space below which a failed write is taken for a full disk: some writers (kineto)
# report a failed write only as a missing file, and what they left has been removed.
_NEARLY_FULL = 1 << 20


def _disk_full(dir_fd: int, err: BaseException, folder_path: str,
               name: str) -> DiskFullError | None:
    """``err`` as a full disk, naming the folder, when that is what it was: ENOSPC or
    EDQUOT anywhere in its chain, or any failed write with (almost) no space left."""
    if isinstance(err, (DiskFullError, UnsafePathError)) or not isinstance(err, Exception):
        return None
    seen: BaseException | None = err
    code = None
    for _ in range(16):  # the chain of causes, not forever
        if seen is None or code is not None:
            break
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            code = seen.errno
        seen = seen.__cause__ or seen.__context__
    free = None
    with contextlib.suppress(OSError):
        found = os.statvfs(dir_fd)
        free = found.f_bavail * found.f_frsize
    if code is None and (free is None or free >= _NEARLY_FULL):
        return None
    what = "quota exceeded" if code == errno.EDQUOT else "no space left on device"
    left = "" if free is None else f", {free} bytes free"
    return DiskFullError(code or errno.ENOSPC,
                         f"disk full: {folder_path} has no room for {name} ({what}{left}; "
                         f"{type(err).__name__}: {err})")


def _remove_temps(dir_fd: int, temp: str, *, derived: bool = True) -> None:
    """Remove the temporary file and, after a failure, every file a writer derived from
    its name (kineto writes ``<temp>.json.tmp`` and leaves it on a full disk)."""
    names = [temp]
    if derived:
        with contextlib.suppress(OSError):
            names += [n for n in os.listdir(dir_fd) if n.startswith(temp) and n != temp]
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


def _sync_written(dir_fd: int, temp: str, shown: str) -> os.stat_result:
    """Sync the file the writer wrote; refuse it if it is no longer a regular file (the
    writer went by path, so look at what is there now, without following a link)."""
    try:
        fd = os.open(temp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(f"{shown} was replaced by a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(f"{shown} was replaced by something not a regular file")
        _fsync(fd)
    finally:
        os.close(fd)
    return info


def _publish(dir_fd: int, temp: str, base: str, ext: str, info: os.stat_result) -> str:
    """Give the temporary file its final name (the first free of base+ext, base.1+ext...)."""
    hard_links = True
    n = 0
    while True:
        name = base + ext if n == 0 else f"{base}.{n}{ext}"
        try:
            if hard_links:
                os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd,
                        follow_symlinks=False)
            else:
                _claim_and_move(dir_fd, temp, name)
        except FileExistsError:
            n += 1
            continue
        except OSError as err:
            if hard_links and err.errno in _NO_HARD_LINKS:
                hard_links = False
                continue
            raise
        try:
            _same_file(dir_fd, name, info)
            _fsync(dir_fd)  # the new name survives a machine crash
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise
        return name


def _same_file(dir_fd: int, name: str, info: os.stat_result) -> None:
    """The published name is the file that was written and checked (not a swapped-in one)."""
    now = os.lstat(name, dir_fd=dir_fd)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(now.st_mode):
        raise UnsafePathError(f"{name} was replaced while it was being published")




def publish(path: str, write: Callable[[IO[bytes]], object], *, force: bool = False) -> int:
    """Write the file ``path`` whole or not at all; its size. For tools given a file name
    by the user (``report -o``, ``merge -o``, ``memory-plot -o``).

    ``write(f)`` writes the bytes to ``f``, a new hidden temporary file (a name
    :func:`~policy_engine.files.layout.find_leftovers` knows, made with ``O_EXCL |
    O_NOFOLLOW``) in ``path``'s folder.
    The file is synced, then named ``path`` by a hard link, which never replaces a file:
    FileExistsError when ``path`` exists, unless ``force``, which replaces it (a link at
    ``path`` is replaced, never followed). The temporary file is removed whatever happens,
    a SIGTERM or SIGINT included (:func:`~policy_engine.files.interrupt.stopped_cleanly`).
    """
    with stopped_cleanly():
        return _publish_file(path, write, force)


def _publish_file(path: str, write: Callable[[IO[bytes]], object], force: bool) -> int:
    where, name = os.path.split(os.path.abspath(path))
    dir_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    temp = temp_name()
    try:
        fd = os.open(temp, _NEW_FILE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                _fsync(f.fileno())
                size = os.fstat(f.fileno()).st_size
            if force:
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                _link_new(dir_fd, temp, name)
            _fsync(dir_fd)  # the new name survives a machine crash
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return size


def _link_new(dir_fd: int, temp: str, name: str) -> None:
    """Name ``temp`` also ``name``, which must not exist (FileExistsError)."""
    try:
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
    _claim_and_move(dir_fd, temp, name)


def _claim_and_move(dir_fd: int, temp: str, name: str) -> None:
    """Where there are no hard links: claim ``name`` exclusively (FileExistsError when it
    exists), then move the file onto it."""
    os.close(os.open(name, _NEW_FILE_FLAGS, 0o644, dir_fd=dir_fd))
    try:
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise


def moved_from(src: str) -> Callable[[str], None]:
    """A writer for :func:`write_atomic` that moves the file ``src`` (another tool's output)
    onto the temporary name: a rename on the same file system (the tool's bytes, not a
    copy), else a copy and the removal of ``src``."""
    def writer(temp: str) -> None:
        try:
            os.replace(src, temp)
        except OSError:
            shutil.copyfile(src, temp)
            os.unlink(src)
    return writer


def rename_folder(src: str, target: str) -> bool:
    """Give the folder ``src`` (a tool wrote it) the name ``target`` if that name is free:
    the name is claimed first with ``mkdir``, so the rename replaces only that empty folder,
    never another one. False, and ``src`` left as it is, when ``target`` exists."""
    try:
        os.mkdir(target)
    except FileExistsError:
        return False
    os.rename(src, target)
    return True
