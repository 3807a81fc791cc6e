"""SFTP inside an instance's container, as the container's root user.

Every path is resolved by the kernel inside the container's own view of its file system:
openat2(2) with RESOLVE_IN_ROOT from the root of the container's init
(`/proc/<pid>/root`: its mounts, the /workspace volume among them), so `..`, absolute
symlinks and magic links (`/proc/*/root`, refused) never leave it. An operation on a name
(mkdir, remove, rename, link, symlink, readlink) resolves its parent that way and acts on
the last component through the parent's descriptor; attributes are set through the
descriptor of what was resolved. Nothing is resolved twice.

Each operation runs in a worker thread whose file-system ids are, for that call, the host
ids the container's root maps to (setfsuid/setfsgid are per thread), without supplementary
groups: the host checks permissions as for the container's root, which owns what it creates.
Absolute paths are the container's; relative ones are relative to /workspace. What this class
does not implement (SFTPv5+ open, lsetstat) reaches `map_path`, which refuses it.
"""

import asyncio
import ctypes
import os
import posixpath
import stat
from concurrent.futures import ThreadPoolExecutor

import asyncssh
from asyncssh.sftp import (
    FXF_APPEND,
    FXF_CREAT,
    FXF_EXCL,
    FXF_READ,
    FXF_TRUNC,
    FXF_WRITE,
    SFTPAttrs,
    SFTPName,
    SFTPPermissionDenied,
)

WORKSPACE = b"/workspace"
SYS_OPENAT2 = 437  # the same number on every architecture
SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
RENAME_NOREPLACE = 1
ID_MASK = 0xFFFFFFFF
OVERFLOW_ID = 65534  # how the kernel shows an id the container does not map
WORKERS = 4
CLONE_FS = 0x200
TENANT_UMASK = 0o022

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _check(result: int, what: bytes = b"") -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), what)
    return result


def _without_groups() -> None:
    """A worker thread's start: no supplementary groups, and the umask a tenant's files are
    made with by an SSH server (022), not the agent's own 077 (for this thread only: its file
    system attributes, the umask among them, unshared from the agent's)."""
    _check(_libc.syscall(SYS_SETGROUPS[os.uname().machine], 0, None))
    _check(_libc.unshare(CLONE_FS))
    os.umask(TENANT_UMASK)


# Broken (every call refused) where a worker cannot drop its groups.
_workers = ThreadPoolExecutor(WORKERS, "sftp", initializer=_without_groups)


def _id_map(proc: int, name: str) -> list[tuple[int, int, int]]:
    """A process's uid_map or gid_map: (inside, outside, count) ranges."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    with open(fd, "rb") as f:
        return [tuple(int(n) for n in line.split()) for line in f.read().splitlines()]


def _to_host(ranges, inside: int) -> int:
    for first, outside, count in ranges:
        if first <= inside < first + count:
            return outside + inside - first
    raise SFTPPermissionDenied(f"id {inside} is not mapped in the container")


def _to_container(ranges, host: int) -> int:
    for first, outside, count in ranges:
        if outside <= host < outside + count:
            return first + host - outside
    return OVERFLOW_ID


class Root:
    """An O_PATH descriptor of a container's root and its id maps."""

    def __init__(self, pid: int, still_init):
        """`pid`: the container's init on the host; `still_init()` tells whether it still is
        (asked once /proc/<pid> is held, so that the pid cannot be another process's)."""
        proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not still_init():
                raise ProcessLookupError(f"process {pid} is no longer the container's init")
            self.uids = _id_map(proc, "uid_map")
            self.gids = _id_map(proc, "gid_map")
            self.fd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
        finally:
            os.close(proc)
        self.uid, self.gid = _to_host(self.uids, 0), _to_host(self.gids, 0)

    def open(self, path: bytes, flags: int, mode: int = 0) -> int:
        mode = mode if flags & os.O_CREAT else 0  # openat2 refuses a mode it would not use
        how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        return _check(
            _libc.syscall(SYS_OPENAT2, self.fd, path, ctypes.byref(how), ctypes.sizeof(how)), path
        )

    def parent(self, path: bytes) -> tuple[int, bytes]:
        """The parent directory of `path` (a descriptor) and its last component."""
        head, name = posixpath.split(path.rstrip(b"/"))
        if name in (b"", b".", b".."):
            raise SFTPPermissionDenied(f"{path.decode(errors='replace')}: not a name to act on")
        return self.open(head or b"/", os.O_PATH | os.O_DIRECTORY), name

    def attrs(self, st: os.stat_result) -> SFTPAttrs:
        attrs = SFTPAttrs.from_local(st)
        attrs.uid = _to_container(self.uids, st.st_uid)
        attrs.gid = _to_container(self.gids, st.st_gid)
        return attrs

    def call(self, operation, *args):
        """Run `operation(*args)` with the file-system ids of the container's root."""
        old_gid = _libc.setfsgid(self.gid)
        old_uid = _libc.setfsuid(self.uid)
        try:
            # ids are unsigned 32-bit: a container's range often lies past 2**31, where the C
            # int that setfsuid answers is negative
            if _libc.setfsuid(-1) & ID_MASK != self.uid or _libc.setfsgid(-1) & ID_MASK != self.gid:
                raise SFTPPermissionDenied("cannot act as the container's user")
            return operation(*args)
        finally:
            _libc.setfsuid(old_uid)
            _libc.setfsgid(old_gid)

    def close(self) -> None:
        os.close(self.fd)


def _open_flags(pflags: int) -> int:
    if pflags & FXF_READ and pflags & FXF_WRITE:
        flags = os.O_RDWR
    elif pflags & FXF_WRITE:
        flags = os.O_WRONLY
    else:
        flags = os.O_RDONLY
    for bit, flag in (
        (FXF_APPEND, os.O_APPEND),
        (FXF_CREAT, os.O_CREAT),
        (FXF_TRUNC, os.O_TRUNC),
        (FXF_EXCL, os.O_EXCL),
    ):
        if pflags & bit:
            flags |= flag
    return flags | os.O_NOCTTY | os.O_NONBLOCK  # a FIFO must not hold a worker


class ContainerSFTP(asyncssh.SFTPServer):
    def __init__(self, chan, root: Root, ended=None):
        """`ended()` is called when the session ends."""
        super().__init__(chan)
        self.root = root
        self.ended = ended

    def map_path(self, path: bytes) -> bytes:
        raise SFTPPermissionDenied("not supported here")

    def _path(self, path: bytes) -> bytes:
        if b"\0" in path:
            raise SFTPPermissionDenied("a path with a NUL byte")
        return path if path.startswith(b"/") else posixpath.join(WORKSPACE, path)

    async def _run(self, operation, *args):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_workers, self.root.call, operation, *args)

    async def _on_parent(self, path: bytes, operation):
        """`operation(parent descriptor, name)` on the last component of `path`."""

        def act():
            parent, name = self.root.parent(self._path(path))
            try:
                return operation(parent, name)
            finally:
                os.close(parent)

        return await self._run(act)

    async def _on_fd(self, path: bytes, flags: int, operation):
        """`operation(descriptor)` on what `path` resolves to, opened with `flags`."""

        def act():
            fd = self.root.open(self._path(path), flags)
            try:
                return operation(fd)
            finally:
                os.close(fd)

        return await self._run(act)

    # --- files ----------------------------------------------------------------------------

    async def open(self, path: bytes, pflags: int, attrs: SFTPAttrs) -> int:
        mode = 0o666 if attrs.permissions is None else stat.S_IMODE(attrs.permissions)
        return await self._run(self.root.open, self._path(path), _open_flags(pflags), mode)

    async def close(self, file_obj: int) -> None:
        await self._run(os.close, file_obj)

    async def read(self, file_obj: int, offset: int, size: int) -> bytes:
        return await self._run(os.pread, file_obj, size, offset)

    async def write(self, file_obj: int, offset: int, data: bytes) -> int:
        return await self._run(os.pwrite, file_obj, data, offset)

    async def fstat(self, file_obj: int) -> SFTPAttrs:
        return self.root.attrs(await self._run(os.fstat, file_obj))

    async def fsetstat(self, file_obj: int, attrs: SFTPAttrs) -> None:
        await self._run(self._setstat, file_obj, attrs)

    async def fstatvfs(self, file_obj: int) -> os.statvfs_result:
        return await self._run(os.statvfs, file_obj)

    async def fsync(self, file_obj: int) -> None:
        await self._run(os.fsync, file_obj)

    # --- paths ----------------------------------------------------------------------------

    async def stat(self, path: bytes) -> SFTPAttrs:
        return self.root.attrs(await self._on_fd(path, os.O_PATH, os.fstat))

    async def lstat(self, path: bytes) -> SFTPAttrs:
        return self.root.attrs(await self._on_fd(path, os.O_PATH | os.O_NOFOLLOW, os.fstat))

    async def setstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        await self._on_fd(path, os.O_PATH, lambda fd: self._setstat(fd, attrs))

    async def statvfs(self, path: bytes) -> os.statvfs_result:
        return await self._on_fd(path, os.O_PATH, os.statvfs)

    async def readlink(self, path: bytes) -> bytes:
        return await self._on_parent(path, lambda parent, name: os.readlink(name, dir_fd=parent))

    async def realpath(self, path: bytes) -> bytes:
        """The path as the container names it, normalised without touching the disk."""
        return b"/" + posixpath.normpath(posixpath.join(b"/", self._path(path))).lstrip(b"/")

    async def scandir(self, path: bytes):
        def listing() -> list[SFTPName]:
            container_path = self._path(path)
            directory = self.root.open(container_path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                up = self.root.open(posixpath.join(container_path, b".."), os.O_PATH)
                try:
                    names = [(b".", os.fstat(directory)), (b"..", os.fstat(up))]
                finally:
                    os.close(up)
                for name in os.listdir(directory):
                    try:
                        st = os.stat(name, dir_fd=directory, follow_symlinks=False)
                    except FileNotFoundError:  # removed meanwhile
                        continue
                    names.append((os.fsencode(name), st))
            finally:
                os.close(directory)
            return [SFTPName(name, attrs=self.root.attrs(st)) for name, st in names]

        for entry in await self._run(listing):
            yield entry

    async def mkdir(self, path: bytes, attrs: SFTPAttrs) -> None:
        mode = 0o777 if attrs.permissions is None else stat.S_IMODE(attrs.permissions)
        await self._on_parent(path, lambda parent, name: os.mkdir(name, mode, dir_fd=parent))

    async def rmdir(self, path: bytes) -> None:
        await self._on_parent(path, lambda parent, name: os.rmdir(name, dir_fd=parent))

    async def remove(self, path: bytes) -> None:
        await self._on_parent(path, lambda parent, name: os.unlink(name, dir_fd=parent))

    async def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        """The target is stored as given: it resolves inside the container when followed."""
        if b"\0" in oldpath:
            raise SFTPPermissionDenied("a path with a NUL byte")
        await self._on_parent(
            newpath, lambda parent, name: os.symlink(oldpath, name, dir_fd=parent)
        )

    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        """SFTP's rename: never replaces what is at `newpath`."""
        await self._two_names(oldpath, newpath, _rename_noreplace)

    async def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self._two_names(
            oldpath, newpath, lambda a, x, b, y: os.rename(x, y, src_dir_fd=a, dst_dir_fd=b)
        )

    async def link(self, oldpath: bytes, newpath: bytes) -> None:
        """A hard link to what is at `oldpath` itself (a symlink is not followed)."""
        await self._two_names(
            oldpath,
            newpath,
            lambda a, x, b, y: os.link(x, y, src_dir_fd=a, dst_dir_fd=b, follow_symlinks=False),
        )

    async def _two_names(self, oldpath: bytes, newpath: bytes, operation) -> None:
        def act():
            old_parent, old_name = self.root.parent(self._path(oldpath))
            try:
                new_parent, new_name = self.root.parent(self._path(newpath))
                try:
                    operation(old_parent, old_name, new_parent, new_name)
                finally:
                    os.close(new_parent)
            finally:
                os.close(old_parent)

        await self._run(act)

    def _setstat(self, fd: int, attrs: SFTPAttrs) -> None:
        """Set attributes through a descriptor (an O_PATH one too): /proc/self/fd/N is that
        very file, whatever its path has become since."""
        target = f"/proc/self/fd/{fd}"
        if attrs.size is not None:
            os.truncate(target, attrs.size)
        if attrs.uid is not None or attrs.gid is not None:
            uid = -1 if attrs.uid is None else _to_host(self.root.uids, attrs.uid)
            gid = -1 if attrs.gid is None else _to_host(self.root.gids, attrs.gid)
            os.chown(target, uid, gid)
        if attrs.permissions is not None:
            os.chmod(target, stat.S_IMODE(attrs.permissions))
        if attrs.atime is not None or attrs.mtime is not None:
            st = os.stat(target)
            atime = st.st_atime if attrs.atime is None else attrs.atime
            mtime = st.st_mtime if attrs.mtime is None else attrs.mtime
            os.utime(target, (atime, mtime))

    def exit(self) -> None:
        """The session ends with exit status 0, as OpenSSH's sftp-server's does: scp and sftp
        count a session without one as failed."""
        self.root.close()
        self.channel.exit(0)
        if self.ended:
            self.ended()


def _rename_noreplace(old_parent: int, old_name: bytes, new_parent: int, new_name: bytes) -> None:
    _check(_libc.renameat2(old_parent, old_name, new_parent, new_name, RENAME_NOREPLACE), new_name)
