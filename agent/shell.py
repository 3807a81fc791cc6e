"""A command or a login shell inside an instance's running container, as an async stream: what
the SSH gateway and the browser terminal both speak to.

Its processes live in a cgroup of their own (agent/sessions.py) from before the command runs.
When a shell is closed (its client went, or its access did) nothing it started stays, however it
detached: the processes of its cgroup get SIGHUP, then SIGKILL after a grace, and the engine's
monitor of the exec (Podman's conmon, which would linger for minutes) is ended."""

import asyncio
import contextlib
import os
import signal
import time

from agent import integers
from agent.errors import ApiError
from agent.sessions import SessionGroup, Untracked

READ_SIZE = 65536
STDOUT, STDERR = 1, 2
HANGUP_GRACE_SECONDS = 5.0
PID_WAIT_SECONDS = 2.0
RESIZE_TRIES = 20  # 2 s
_ending: set[asyncio.Task] = set()  # shells being ended, kept from the garbage collector


async def until_either_ends(*directions) -> None:
    """Run the coroutines (the two directions of a relay) until one of them returns; the
    others are cancelled."""
    tasks = [asyncio.ensure_future(direction) for direction in directions]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Shell:
    def __init__(self, runtime, exec_id: str, tty: bool, reader, writer):
        self.runtime = runtime
        self.exec_id = exec_id
        self.tty = tty
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer
        self.group: SessionGroup | None = None  # the cgroup of its processes
        self.withdrawn = False  # closed because its member's access went
        self.closed = False

    @classmethod
    async def open(
        cls,
        host,
        instance: str,
        command: list[str] | None = None,
        *,
        tty: bool = True,
        cols: int = 80,
        rows: int = 24,
        term: str = "xterm-256color",
    ) -> "Shell":
        """Start `command` (None: a login shell) in the instance's running container, its
        processes in a cgroup of their own. ApiError 404 when the instance has no running
        container on this host, 503 when its processes cannot be tracked."""
        runtime = host.runtime
        alloc = host.running_allocation(instance)
        container = await asyncio.to_thread(runtime.running_container, alloc)
        if container is None:
            raise ApiError(404, "not_running", f"instance {instance} is not running here")
        env = {"TERM": term} if tty else {}
        exec_id, sock = await asyncio.to_thread(runtime.exec_open, container, command, tty, env)
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=READ_SIZE)
        shell = cls(runtime, exec_id, tty, reader, writer)
        try:
            leader = await asyncio.to_thread(_wait_for_pid, runtime, exec_id)
            if leader is None:
                raise Untracked("the engine named no process for the session")
            init = container.attrs["State"].get("Pid") or 0
            shell.group = await asyncio.to_thread(SessionGroup.enter, leader, init)
        except (Untracked, OSError) as exc:
            shell.close()
            raise ApiError(503, "session_untracked", f"no session opened: {exc}") from exc
        if tty:
            await shell.resize(cols, rows)
        return shell

    async def read(self) -> tuple[int, bytes] | None:
        """The next output: (STDOUT or STDERR, bytes); None once the command's output ended.
        Without a terminal the engine frames each chunk: stream, 3 zero bytes, size."""
        if self.tty:
            data = await self.reader.read(READ_SIZE)
            return (STDOUT, data) if data else None
        try:
            header = await self.reader.readexactly(8)
            data = await self.reader.readexactly(int.from_bytes(header[4:8], "big"))
        except asyncio.IncompleteReadError:
            return None
        return (STDERR if header[0] == STDERR else STDOUT, data)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close_input(self) -> None:
        """The input ended (stdin EOF): the command reads end of file."""
        if not self.writer.is_closing() and self.writer.can_write_eof():
            self.writer.write_eof()

    async def resize(self, cols: int, rows: int) -> None:
        """Size the terminal. The engine may refuse while it still starts the session (Podman's
        conmon on a busy host): asked again for up to RESIZE_TRIES tenths of a second, then
        left as it is."""
        for _ in range(RESIZE_TRIES):
            if await asyncio.to_thread(self.runtime.exec_resize, self.exec_id, cols, rows):
                return
            await asyncio.sleep(0.1)

    async def exit_code(self) -> int | None:
        return await asyncio.to_thread(self.runtime.exec_exit_code, self.exec_id)

    def close(self) -> None:
        """Close the stream and end what the command left running (in the background)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self.writer.close()
        task = asyncio.get_running_loop().create_task(self._end())
        _ending.add(task)
        task.add_done_callback(_ending.discard)

    async def _end(self) -> None:
        group = self.group
        if group is not None:
            deadline = time.monotonic() + HANGUP_GRACE_SECONDS
            alive = await asyncio.to_thread(group.hang_up)
            while alive and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                alive = await asyncio.to_thread(group.populated)
            await asyncio.to_thread(group.kill)
            deadline = time.monotonic() + PID_WAIT_SECONDS
            while await asyncio.to_thread(group.populated) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(group.remove)
        with contextlib.suppress(Exception):  # the exit is recorded before its monitor goes
            await asyncio.to_thread(self.runtime.exec_exit_code, self.exec_id)
        await asyncio.to_thread(_end_monitors, self.exec_id)


def _wait_for_pid(runtime, exec_id: str) -> int | None:
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while (pid := runtime.exec_pid(exec_id)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def _monitors(pid: str, exec_id: str) -> bool:
    """Whether the process is Podman's conmon for this exec (it names the exec in `-u ID`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]) == b"conmon" and exec_id.encode() in argv


def _end_monitors(exec_id: str) -> None:
    """SIGKILL to the exec's monitors on the host. Each is checked again once a pidfd holds it,
    so that a pid taken over meanwhile by another process is never signalled."""
    for pid in os.listdir("/proc"):
        if not integers.PID.fullmatch(pid) or not _monitors(pid, exec_id):
            continue
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(int(pid))
            try:
                if _monitors(pid, exec_id):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
