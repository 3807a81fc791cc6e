"""A command or a login shell inside an instance's running container, as an async stream: what
the SSH gateway and the browser terminal both speak to.

When a shell is closed (its client went, or its access did) nothing it started stays: the
processes of its session in the container get SIGHUP, then SIGKILL after a grace, and the
engine's monitor of the exec (Podman's conmon, which would linger for minutes) is ended."""

import asyncio
import contextlib
import os
import signal
import time

from agent import integers
from agent.errors import ApiError

READ_SIZE = 65536
STDOUT, STDERR = 1, 2
HANGUP_GRACE_SECONDS = 5.0
PID_WAIT_SECONDS = 2.0
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
        self.leader: int | None = None  # the exec's process: its session id on the host
        self.namespace: int | None = None  # the container's pid namespace

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
        """Start `command` (None: a login shell) in the instance's running container.
        ApiError 404 when the instance has no running container on this host."""
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
        shell.namespace = _pid_namespace(container.attrs["State"].get("Pid"))
        shell.leader = await asyncio.to_thread(_wait_for_pid, runtime, exec_id)
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
        await asyncio.to_thread(self.runtime.exec_resize, self.exec_id, cols, rows)

    async def exit_code(self) -> int | None:
        return await asyncio.to_thread(self.runtime.exec_exit_code, self.exec_id)

    def close(self) -> None:
        """Close the stream and end what the command left running (in the background)."""
        with contextlib.suppress(OSError):
            self.writer.close()
        task = asyncio.get_running_loop().create_task(self._end())
        _ending.add(task)
        task.add_done_callback(_ending.discard)

    async def _end(self) -> None:
        if self.leader and self.namespace:
            members = (self.leader, self.namespace)
            deadline = time.monotonic() + HANGUP_GRACE_SECONDS
            alive = await asyncio.to_thread(_signal_each, _in_session, members, signal.SIGHUP)
            while alive and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                alive = await asyncio.to_thread(_signal_each, _in_session, members, 0)
            if alive:
                await asyncio.to_thread(_signal_each, _in_session, members, signal.SIGKILL)
        with contextlib.suppress(Exception):  # the exit is recorded before its monitor goes
            await asyncio.to_thread(self.runtime.exec_exit_code, self.exec_id)
        await asyncio.to_thread(_signal_each, _monitors, self.exec_id, signal.SIGKILL)


def _wait_for_pid(runtime, exec_id: str) -> int | None:
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while (pid := runtime.exec_pid(exec_id)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def _pid_namespace(pid: int | None) -> int | None:
    """The pid namespace of the container's init, unless it is the agent's own (then the
    container shares the host's, or the pid is no longer the init's): None."""
    try:
        namespace = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except (OSError, TypeError):
        return None
    return None if namespace == os.stat("/proc/self/ns/pid").st_ino else namespace


def _in_session(pid: str, members: tuple[int, int]) -> bool:
    """Whether the process is alive (not a zombie) in the session and pid namespace."""
    session, namespace = members
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (
            fields[0] != b"Z"
            and int(fields[3]) == session
            and os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace
        )
    except (OSError, IndexError, ValueError):
        return False


def _monitors(pid: str, exec_id: str) -> bool:
    """Whether the process is Podman's conmon for this exec (it names the exec in `-u ID`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]) == b"conmon" and exec_id.encode() in argv


def _signal_each(belongs, detail, sig: int) -> int:
    """Send `sig` (0: none) to every host process for which `belongs(pid, detail)` holds;
    answer how many there were. Each is checked again once a pidfd holds it, so that a pid
    taken over meanwhile by another process is never signalled."""
    count = 0
    for pid in os.listdir("/proc"):
        if not integers.PID.fullmatch(pid) or not belongs(pid, detail):
            continue
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(int(pid))
            try:
                if belongs(pid, detail):
                    signal.pidfd_send_signal(fd, sig)
                    count += 1
            finally:
                os.close(fd)
    return count
