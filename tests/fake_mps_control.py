"""A stand-in for `nvidia-cuda-mps-control`, for hosts without NVIDIA's: `-d` "starts" a daemon
by making the files the real one makes in CUDA_MPS_PIPE_DIRECTORY (the `control` and
`control_privileged` sockets, `control_lock`, the `log` pipe, the pid file); without arguments it
takes commands on stdin as the real CLI does. Each start and command is a line of
$FAKE_MPS_CALLS: `<pipe directory> <CUDA_VISIBLE_DEVICES> start|<command>`. A command named in
the file $FAKE_MPS_CALLS.fail fails, as the real CLI does with a bad one."""

import os
import socket
import sys
from pathlib import Path

FILES = ("control", "control_privileged", "control_lock", "log", "nvidia-cuda-mps-control.pid")


def record(pipe: Path, what: str) -> None:
    with open(os.environ["FAKE_MPS_CALLS"], "a") as calls:
        calls.write(f"{pipe} {os.environ.get('CUDA_VISIBLE_DEVICES', '')} {what}\n")


def start(pipe: Path) -> int:
    if (pipe / "control").exists():
        print("An instance of this daemon is already running")
        return 1
    for name in ("control", "control_privileged"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(pipe / name))
        listener.close()  # the socket's file stays, as the daemon's would
    (pipe / "control").chmod(0o666)
    (pipe / "control_privileged").chmod(0o755)
    (pipe / "control_lock").touch()
    os.mkfifo(pipe / "log")
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    record(pipe, "start")
    return 0


def command(pipe: Path, line: str) -> int:
    if not (pipe / "control").exists():
        print("Cannot find MPS control daemon process")
        return 1
    record(pipe, line)
    failing = Path(os.environ["FAKE_MPS_CALLS"] + ".fail")
    if failing.exists() and line in failing.read_text().splitlines():
        print(f"Invalid command: {line}")
        return 1
    if line == "quit":
        for name in FILES:
            (pipe / name).unlink(missing_ok=True)
    return 0


def main() -> int:
    pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])  # the agent always names it
    if sys.argv[1:] == ["-d"]:
        return start(pipe)
    for line in sys.stdin.read().splitlines():
        if line.strip() and (code := command(pipe, line.strip())):
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
