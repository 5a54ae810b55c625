"""Shared-memory segments: one per rank, a memfd or a /dev/shm file.

Nothing of ours stays in /dev/shm once setup is over, even if a rank
is SIGKILLed later. A segment is a memfd (it has no name at all) that peers
open through /proc/<pid>/fd/<fd> while its owner is alive. Where that does not
work (a peer in another pid namespace, a hardened /proc), the segment is a
file /dev/shm/collie-<job>-<rank>-<pid>, unlinked as soon as every peer has
mapped it; if a rank dies during setup, the launcher removes collie-<job>-*,
and where no launcher is left to do so, the next setup on the host removes
the files of dead owners (sweep_segments). COLLIE_SHM_MEMFD=0 (or
``memfd=False``) forces the file.

"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import stat
from typing import Optional

def open_memfd(pid: int, fd: int) -> int:
    """Open another process's memfd (works for processes of the same user in
    the same pid namespace, while the owner keeps the fd open)."""
    return os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)


SHM_DIR = "/dev/shm"


SEGMENT_FILE = re.compile(r"collie-.+-\d+-(\d+)")  # collie-<job>-<rank>-<owner's pid>


class Segment:
    """One shared-memory segment: a memfd or a /dev/shm file, and its mapping.

    A file's owner holds an exclusive flock on it until it unlinks it, so
    that a later job can tell a file left by a dead owner (sweep_segments).
    """

    def __init__(self, size: int, memfd: bool, name: str):
        self.size = size
        self.path: Optional[str] = None
        if memfd:
            self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        else:
            self.path = f"{SHM_DIR}/{name}"
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if not memfd:
                fcntl.flock(self.fd, fcntl.LOCK_EX)  # waits out a sweeper looking at it
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            self.release_name()
            raise

    def info(self) -> dict:
        where = {"path": self.path} if self.path else {"pid": os.getpid(), "fd": self.fd}
        return dict(where, size=self.size)

    def release_name(self) -> None:
        """Remove every way to reach the segment but the mapping itself."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def sweep_segments() -> list[str]:
    """Remove the segment files in /dev/shm whose owner is dead; returns
    their paths.

    A file lives only while its owner sets up, but an owner SIGKILLed then,
    with no launcher left to remove it (torchrun, mpiexec, a killed
    ``collie run``), leaves it behind; every later setup on the host sweeps.
    A file goes only if it is this user's, has collie's name, its owner's
    pid is not alive here, and its lock is free: a live owner in another
    pid namespace still holds the lock.
    """
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        match = SEGMENT_FILE.fullmatch(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        path = f"{SHM_DIR}/{name}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, or not ours to open
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            now = os.stat(path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):  # not a new file of that name
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    return True


def map_peer(info: dict) -> mmap.mmap:
    fd = open_memfd(info["pid"], info["fd"]) if "fd" in info else os.open(info["path"], os.O_RDWR)
    try:
        return mmap.mmap(fd, info["size"])
    finally:
        os.close(fd)


def close_mapping(mm: Optional[mmap.mmap]) -> None:
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass  # someone still holds a view (a piece given to combine); GC unmaps it later
