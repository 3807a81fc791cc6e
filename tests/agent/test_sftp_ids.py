"""SFTP acts with the file-system ids of the container's root, whatever part of the 32-bit id
space its user namespace lies in (Podman's `auto` ranges start at 2**31 - 1 and go up)."""

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from agent import sftp


@pytest.mark.skipif(os.geteuid() != 0, reason="setfsuid needs root")
@pytest.mark.parametrize("host_id", [1000, 2**31 - 1, 2**31 + 65535, 2**32 - 2])
def test_a_file_is_made_as_the_mapped_root(host_id):
    root = sftp.Root.__new__(sftp.Root)
    root.uid = root.gid = host_id
    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # reachable by any uid, as a container's root is
    folder.chmod(0o777)
    made = folder / "made"

    def create():
        with open(made, "w") as f:
            f.write("x")

    thread = threading.Thread(target=root.call, args=(create,))  # fs ids are per thread
    thread.start()
    thread.join()
    try:
        assert (made.stat().st_uid, made.stat().st_gid) == (host_id, host_id)
    finally:
        shutil.rmtree(folder)
