"""The directories metralectl owns: the one gate for writes there.

Every change under a directory metralectl owns (the HF hub cache, the synced recipe set) goes through
an `Owned` (docs/security.md): addressed by a path relative to it, walked one component at a time
from a directory descriptor with O_NOFOLLOW, so a symlink anywhere on the way is refused, never
followed out (and a directory swapped for a link between a check and a use changes nothing: there is
no second lookup by name). A link made here must point inside the directory. Reading through the
cache's own links (a snapshot entry to its blob) follows them only while each hop stays inside
(`resolve`). The names used here come from outside checked first (metralectl.names).

The owned directory itself may be reached through the user's own symlinks (HF_HUB_CACHE on a
larger disk): that is their choice, made once, above what we own. Foundation layer: stdlib only.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean


class OutsideOwned(MetralError):
    """A path would leave a directory metralectl owns (a symlink on the way, `..`, an absolute link)."""

    exit_code = ExitCode.DATA


class Owned:
    """A directory metralectl owns for one purpose (the HF hub cache, the synced recipe set).

    Paths are relative to the root (str with "/" or a Path; an absolute Path must lie lexically
    under the root). Every method walks from the root's descriptor, one component at a time, with
    O_NOFOLLOW: a symlink on the way raises OutsideOwned; a missing directory raises
    FileNotFoundError unless asked to create it.
    """

    def __init__(self, root: Path | str, what: str) -> None:
        self.root = Path(os.path.abspath(root))
        self.what = what

    def __repr__(self) -> str:
        return f"Owned({str(self.root)!r}, {self.what!r})"

    # --- addressing -----------------------------------------------------------------------------------
    def parts(self, rel: str | PurePosixPath | Path) -> tuple[str, ...]:
        """The components of `rel` under the root; refuses `..`, `.` and anything outside."""
        if isinstance(rel, Path) and rel.is_absolute():
            try:
                rel = rel.relative_to(self.root)
            except ValueError:
                raise OutsideOwned(f"{clean(str(rel))} is not inside {self.what} ({self.root})") from None
        text = str(rel).replace(os.sep, "/") if isinstance(rel, Path) else str(rel)
        if text in ("", "."):
            return ()
        if text.startswith("/"):
            raise OutsideOwned(f"{clean(text)} is not a path inside {self.what}")
        parts = tuple(p for p in text.split("/") if p not in ("",))
        for part in parts:
            if part in (".", "..") or "\x00" in part:
                raise OutsideOwned(f"{clean(text)!r} leaves {self.what} (a {part!r} component)")
        return parts

    def path(self, rel: str | PurePosixPath | Path) -> Path:
        """The absolute path of `rel` (for messages and for reading; changes go through the methods)."""
        return self.root.joinpath(*self.parts(rel))

    def contains(self, path: Path) -> bool:
        """Whether an absolute path lies lexically under the root."""
        try:
            Path(os.path.normpath(path)).relative_to(self.root)
            return True
        except ValueError:
            return False

    def make_root(self, mode: int = 0o777) -> None:
        """Create the root itself (and the directories above it) when missing. The path to it is the user's
        (a link above or at the root is their choice, followed); everything below is walked as above."""
        try:
            os.makedirs(self.root, mode, exist_ok=True)
        except FileExistsError:
            pass  # a file where the directory should be: said below
        if not os.path.isdir(self.root):
            raise OutsideOwned(f"{self.what} ({clean(str(self.root))}) is not a directory")

    # --- walking ----------------------------------------------------------------------------------------
    def _open_root(self) -> int:
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _down(self, fd: int, name: str, create: bool, mode: int, shown: str) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(name, flags, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OutsideOwned(self._not_followed(shown, name)) from None
            raise
        try:
            os.mkdir(name, mode, dir_fd=fd)
        except FileExistsError:
            pass  # made meanwhile by another pull: opened (and checked) below like any other
        try:
            return os.open(name, flags, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OutsideOwned(self._not_followed(shown, name)) from None
            raise

    def _not_followed(self, shown: str, name: str) -> str:
        return (f"{clean(shown)}: {clean(name)!r} is a symlink or not a directory; metralectl does not follow links "
                f"out of {self.what} ({self.root})")

    @contextmanager
    def _dir(self, parts: tuple[str, ...], create: bool = False, mode: int = 0o777) -> Iterator[int]:
        fd = self._open_root()
        try:
            for name in parts:
                nxt = self._down(fd, name, create, mode, "/".join(parts))
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _parent(self, rel: str | PurePosixPath | Path, create: bool = False) -> Iterator[tuple[int, str]]:
        parts = self.parts(rel)
        if not parts:
            raise OutsideOwned(f"the root of {self.what} itself cannot be changed this way")
        with self._dir(parts[:-1], create) as fd:
            yield fd, parts[-1]

    # --- reading ----------------------------------------------------------------------------------------
    def lstat(self, rel: str | PurePosixPath | Path) -> os.stat_result | None:
        """The entry itself (a link is not followed); None when it or a directory above is missing."""
        try:
            with self._parent(rel) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_dir(self, rel: str | PurePosixPath | Path) -> bool:
        st = self.lstat(rel) if self.parts(rel) else os.stat(self.root)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def listdir(self, rel: str | PurePosixPath | Path = "") -> list[str]:
        """Names in a directory (empty when it is missing)."""
        try:
            with self._dir(self.parts(rel)) as fd:
                return sorted(os.listdir(fd))
        except FileNotFoundError:
            return []

    def link_target(self, rel: str | PurePosixPath | Path) -> tuple[str, ...] | None:
        """Where a symlink entry points, as components under the root; None when it is no link or points
        outside (absolute, or `..` past the root)."""
        parts = self.parts(rel)
        try:
            with self._parent(rel) as (fd, name):
                target = os.readlink(name, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return None
        if target.startswith("/"):
            return None
        joined = posixpath.normpath(posixpath.join("/".join(parts[:-1]), target))
        if joined == ".." or joined.startswith("../") or joined.startswith("/"):
            return None
        return tuple(p for p in joined.split("/") if p not in ("", "."))

    def resolve(self, rel: str | PurePosixPath | Path, hops: int = 8) -> tuple[str, ...] | None:
        """`rel` with the links inside the root followed (a snapshot entry to its blob): the components of
        what it names, or None when a link on the way leaves the root or it is missing."""
        found = self._follow(self.parts(rel), hops)
        return found[0] if found is not None else None

    def _follow(self, parts: tuple[str, ...], hops: int) -> tuple[tuple[str, ...], os.stat_result] | None:
        """One walk from the root by descriptors (O_NOFOLLOW), a link met on the way replaced by its target
        and the walk begun again (at most `hops` times); the final components and their lstat, or None."""
        for _ in range(hops + 1):
            fd = self._open_root()
            try:
                if not parts:
                    return parts, os.fstat(fd)
                restart = None
                for i, name in enumerate(parts):
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except (FileNotFoundError, NotADirectoryError):
                        return None
                    if stat.S_ISLNK(st.st_mode):
                        target = os.readlink(name, dir_fd=fd)
                        joined = posixpath.normpath(posixpath.join("/".join(parts[:i]), target))
                        if target.startswith("/") or joined == ".." or joined.startswith("../"):
                            return None
                        restart = tuple(p for p in joined.split("/") if p not in ("", ".")) + parts[i + 1:]
                        break
                    if i == len(parts) - 1:
                        return parts, st
                    if not stat.S_ISDIR(st.st_mode):
                        return None
                    try:
                        nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    except OSError:
                        return None  # swapped for a link or a file meanwhile: not followed
                    os.close(fd)
                    fd = nxt
            finally:
                os.close(fd)
            assert restart is not None
            parts = restart
        return None

    def open_read(self, rel: str | PurePosixPath | Path, follow_inside: bool = False) -> int:
        """A descriptor to read a regular file; with `follow_inside`, links within the root are followed
        (resolve), never one that leaves it. Anything but a regular file (a FIFO, a device) is refused."""
        parts = self.resolve(rel) if follow_inside else self.parts(rel)
        if parts is None:
            raise OutsideOwned(f"{clean(str(rel))} leads out of {self.what} ({self.root}); not read")
        with self._parent("/".join(parts)) as (fd, name):
            handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            os.close(handle)
            raise OutsideOwned(f"{clean(str(rel))} in {self.what} is not a regular file; not read")
        os.set_blocking(handle, True)
        return handle

    def stat_inside(self, rel: str | PurePosixPath | Path) -> os.stat_result | None:
        """stat() through the links inside the root (a snapshot entry's blob); None when missing or when a
        link leaves the root. One walk (`list` stats every snapshot file on every run)."""
        found = self._follow(self.parts(rel), 8)
        return found[1] if found is not None else None

    def read_bytes(self, rel: str | PurePosixPath | Path, limit: int, follow_inside: bool = False) -> bytes:
        """At most `limit` bytes of a regular file; more is an error (whatever st_size claims)."""
        fd = self.open_read(rel, follow_inside)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise OutsideOwned(f"{clean(str(rel))} in {self.what} is larger than {limit} bytes; not read")
        return data

    # --- changing ---------------------------------------------------------------------------------------
    def make_dirs(self, rel: str | PurePosixPath | Path, mode: int = 0o777) -> None:
        """Create `rel` and its parents (an existing directory is fine; a link on the way is refused)."""
        with self._dir(self.parts(rel), create=True, mode=mode):
            pass

    def open_write(self, rel: str | PurePosixPath | Path, flags: int, mode: int = 0o666,
                   create_parents: bool = False) -> int:
        """os.open of `rel` for writing, never through a link (the entry or a directory above)."""
        with self._parent(rel, create_parents) as (fd, name):
            try:
                return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise OutsideOwned(self._not_followed(str(rel), name)) from None
                raise

    def put(self, rel: str | PurePosixPath | Path, data: bytes | str, mode: int | None = None) -> None:
        """Replace `rel` with `data` atomically and durably (atomicfile's rules, under the root's walk)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        with self._parent(rel, create=True) as (fd, name):
            if mode is None:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
                except FileNotFoundError:
                    pass
            tmp = f".{name[:100]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666 if mode is None else 0o600, dir_fd=fd)
            try:
                try:
                    if mode is not None:
                        os.fchmod(handle, mode)
                    view = memoryview(payload)
                    while view:
                        view = view[os.write(handle, view):]
                    os.fsync(handle)
                finally:
                    os.close(handle)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
                raise
            _fsync_fd(fd)

    def remove_file(self, rel: str | PurePosixPath | Path, missing_ok: bool = True) -> bool:
        """Remove a file or a link entry (the link itself: what it points to is never touched)."""
        try:
            with self._parent(rel) as (fd, name):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "is a directory", str(self.path(rel)))
                os.unlink(name, dir_fd=fd)
                return True
        except (FileNotFoundError, NotADirectoryError):
            if missing_ok:
                return False
            raise

    def remove_dir(self, rel: str | PurePosixPath | Path) -> bool:
        """rmdir of an empty directory; False when it is missing or not empty."""
        try:
            with self._parent(rel) as (fd, name):
                os.rmdir(name, dir_fd=fd)
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise

    def remove_tree(self, rel: str | PurePosixPath | Path) -> None:
        """Remove a directory and everything under it without following any link (a link inside is removed
        as a link; one at `rel` itself is refused: it is not ours to remove through)."""
        with self._parent(rel) as (fd, name):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise OutsideOwned(self._not_followed(str(rel), name))
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                return
            _remove_tree_at(fd, name)

    def move(self, src: str | PurePosixPath | Path, dst: str | PurePosixPath | Path) -> None:
        """rename(2) inside the root (atomic, replacing `dst`), durable."""
        with self._parent(src) as (sfd, sname), self._parent(dst, create=True) as (dfd, dname):
            os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            _fsync_fd(dfd)

    def link(self, rel: str | PurePosixPath | Path, target: str, within: str | PurePosixPath | Path = "") -> None:
        """Make `rel` a relative symlink to `target`, replacing what is there in one step. The target must
        stay inside the root (and under `within` when given)."""
        parts = self.parts(rel)
        if target.startswith("/"):
            raise OutsideOwned(f"a link to an absolute path ({clean(target)}) is not made in {self.what}")
        joined = posixpath.normpath(posixpath.join("/".join(parts[:-1]), target))
        bound = "/".join(self.parts(within))
        if joined == ".." or joined.startswith("../") or (bound and not (joined + "/").startswith(bound + "/")):
            raise OutsideOwned(f"a link {clean('/'.join(parts))} -> {clean(target)} would leave "
                               f"{bound or self.what}; not made")
        with self._parent(rel, create=True) as (fd, name):
            tmp = f".{name[:100]}.{os.getpid()}.{os.urandom(4).hex()}.link"
            os.symlink(target, tmp, dir_fd=fd)
            try:
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
                raise
            _fsync_fd(fd)

    def chmod(self, rel: str | PurePosixPath | Path, mode: int) -> None:
        """chmod of a regular file or directory entry, never through a link."""
        if self.is_dir(rel):
            with self._dir(self.parts(rel)) as dfd:
                os.fchmod(dfd, mode)
            return
        fd = self.open_write(rel, os.O_RDONLY)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _remove_tree_at(parent_fd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree_at(fd, entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
