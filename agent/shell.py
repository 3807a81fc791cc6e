"""A command or a login shell inside an instance's running container, as an async stream: what
the SSH gateway and the browser terminal both speak to."""

import asyncio
import contextlib

from agent.errors import ApiError

READ_SIZE = 65536
STDOUT, STDERR = 1, 2


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
        with contextlib.suppress(OSError):
            self.writer.close()
