"""One writer per folder: the lock a command holds on its output folder while it writes there.

A command that fills an output folder over minutes or hours (``prefalign verify sweep``, ``search``, ``grid``,
``report`` and ``prefalign llm sweep``) holds :class:`FolderLock` on that folder from its first write to its end.
A second command on the same folder is refused before it does any work (:class:`FolderBusyError`, naming the
holder); without the lock both would compute every cell, and the second would remove the run directories the first
is writing.

**The lock file.** ``DIR/.prefalign.lock`` (:data:`LOCK_NAME`) holds one JSON object that names its holder
(:func:`holder_record`): the process id ``pid``, the ``host``, the machine's ``boot_id`` and the process's start
time in clock ticks since boot ``process_start`` (both read from ``/proc``, ``null`` where there is none), the
wall-clock time it was taken ``started`` (ISO 8601) and the ``command`` line. It is removed when the holder
releases the lock: at the normal end of the command, on an error and on Ctrl-C.

**Taken atomically.** The holder keeps the file open with an exclusive ``flock``; ``flock`` is atomic, belongs to
the open file, not to the name, and the kernel drops it when the process ends however it ends (``kill -9``, out of
memory, a crashed machine's locks on an NFS server). So a lock file whose ``flock`` can be taken was left by a
process that ended without releasing it (killed): it is *stale*, and is taken over, with a note naming the
process that left it. A lock file removed or replaced between the ``open`` and the ``flock`` is opened again, so two
processes never hold locks on two different files of the same name.

**File systems without locks.** Where ``flock`` is not supported (Lustre mounted ``noflock``, some FUSE file systems:
``ENOLCK``, ``ENOSYS``, ``EOPNOTSUPP``, ``EINVAL``) the lock file alone decides, with a note saying so: a new lock
file is created with ``O_CREAT | O_EXCL`` (atomic); an existing one is stale when its holder ran on this machine and
is gone (its process does not exist, is a zombie, or its ``pid`` now belongs to a process started at another time,
or the machine has restarted since: :func:`holder_alive`), and busy otherwise, including a holder on another machine,
which cannot be checked from here (remove the file by hand when that process has ended). Two commands that find
the same stale file at the same instant may then both take it over.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["LOCK_NAME", "LOCK_KIND", "FolderLockError", "FolderBusyError", "FolderLock", "holder_record",
           "holder_alive", "describe_holder", "command_line", "process_start"]

#: The lock file in a locked folder.
LOCK_NAME = ".prefalign.lock"
#: The ``lock`` entry of a lock file's object.
LOCK_KIND = "prefalign-verify writer lock"
#: ``flock`` errors that mean "this file system has no locks", not "the lock is held".
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
#: How often a lock file that changes under us is opened again before giving up (it never takes more than two).
_ATTEMPTS = 20


class FolderLockError(ValueError):
    """The folder cannot be locked: its lock file cannot be opened or written (the message says why)."""


class FolderBusyError(FolderLockError):
    """Another process writes the folder: the message names it (``holder``: its lock-file record, ``{}`` when it
    has not written one yet)."""

    def __init__(self, message: str, holder: dict[str, Any]):
        super().__init__(message)
        self.holder = holder


def command_line(argv: Sequence[str] | None = None) -> str:
    """This process's command line as a user typed it (``argv``: default ``sys.orig_argv``): the interpreter is
    shown as ``python`` before ``-m MODULE`` and left out before a script, whose path is cut to its name
    (``prefalign verify sweep ...``, ``python -m llm_runs sweep ...``)."""
    a = list(sys.orig_argv if argv is None else argv)
    if len(a) >= 3 and a[1] == "-m":
        a = ["python", *a[1:]]
    elif len(a) >= 2 and not a[1].startswith("-"):
        a = [Path(a[1]).name, *a[2:]]
    return shlex.join(a)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> tuple[int, str] | None:
    """``(start time in clock ticks since boot, state letter)`` of process ``pid`` from ``/proc/<pid>/stat``; None
    when there is no such process or no ``/proc``."""
    try:
        data = Path(f"/proc/{int(pid)}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return int(fields[19]), fields[0].decode()  # field 22: starttime


def holder_record(command: str | None = None) -> dict[str, Any]:
    """The record this process writes into a lock file it holds (module docstring)."""
    start = process_start(os.getpid())
    return {"lock": LOCK_KIND, "pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id(),
            "process_start": None if start is None else start[0],
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command_line() if command is None else command}


def holder_alive(holder: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether the process a lock-file record names still runs, and why not: ``(True, "")``; ``(False, why)``;
    ``(None, why)`` when it cannot be told (a process on another host). Same host: the process exists and is not a
    zombie, its start time is the recorded one (else its pid was reused) and the machine has not restarted since."""
    host = holder.get("host")
    if host != socket.gethostname():
        return None, f"it ran on host {host!r}, which cannot be checked from here"
    boot = _boot_id()
    if holder.get("boot_id") and boot and holder["boot_id"] != boot:
        return False, "the machine has restarted since"
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False, f"it names no process (pid {pid!r})"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, f"pid {pid} is no longer running"
    except PermissionError:  # a process of another user
        pass
    start = process_start(pid)
    if start is not None and start[1] in "ZX":
        return False, f"pid {pid} has exited"
    recorded = holder.get("process_start")
    if start is not None and isinstance(recorded, int) and start[0] != recorded:
        return False, f"pid {pid} is now another process (started at another time)"
    return True, ""


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host h since 2026-05-09T07:35:25+00:00 (python -m verification sweep ...)``."""
    if not holder:
        return "a process that has not recorded itself yet"
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')} "
            f"({holder.get('command')})")


def _read(fd: int) -> dict[str, Any] | None:
    """The record in the open lock file ``fd``: None when it is empty, ``{}`` when it is not a record."""
    data = os.pread(fd, 1 << 16, 0)
    if not data.strip():
        return None
    try:
        rec = json.loads(data)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) and rec.get("lock") == LOCK_KIND else {}


class FolderLock:
    """The writer lock of ``folder`` (which must exist): :meth:`acquire`, :meth:`release`, or ``with`` (module
    docstring). ``command``: the command line the lock file records (default :func:`command_line`)."""

    def __init__(self, folder: str | Path, command: str | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _open(self) -> tuple[int, bool] | None:
        """The lock file opened for reading and writing, and whether this call created it (None: it vanished
        between two calls; open it again)."""
        try:
            return os.open(self.path, os.O_RDWR), False
        except FileNotFoundError:
            pass
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
        except FileExistsError:
            return None

    def _is_current(self, fd: int) -> bool:
        """True iff ``fd`` is still the file at ``self.path`` (not removed or replaced since it was opened)."""
        try:
            st, now = os.fstat(fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)

    def _busy(self, fd: int, why: str = "") -> FolderBusyError:
        holder = _read(fd)
        for _ in range(10):  # a holder that has just taken the lock writes its record at once
            if holder:
                break
            time.sleep(0.02)
            holder = _read(fd)
        holder = holder or {}
        return FolderBusyError(f"{str(self.folder)!r} is being written by {describe_holder(holder)}{why}: one "
                               f"writer per folder (lock file {str(self.path)!r})", holder)

    def acquire(self, note: Callable[[str], None] | None = None) -> None:
        """Take the lock, or raise :class:`FolderBusyError` naming the process that holds it (or
        :class:`FolderLockError` when the lock file cannot be opened or written). ``note(message)`` is told when a
        stale lock is taken over and when the file system has no locks."""
        if self._fd is not None:
            raise RuntimeError(f"the lock of {str(self.folder)!r} is held already")
        note = note or (lambda _msg: None)
        for _ in range(_ATTEMPTS):
            try:
                opened = self._open()
            except OSError as exc:
                raise FolderLockError(f"cannot open the lock file {str(self.path)!r}: {exc.strerror or exc}") from None
            if opened is None:
                continue
            fd, created = opened
            try:
                if self._try_lock(fd, created, note):
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise FolderLockError(f"the lock file {str(self.path)!r} kept changing while it was being taken")

    def _try_lock(self, fd: int, created: bool, note: Callable[[str], None]) -> bool:
        """Lock the open lock file ``fd`` and write this process's record into it; False when the file was removed
        or replaced meanwhile (open it again)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            kernel = True
        except BlockingIOError:
            raise self._busy(fd) from None
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                raise FolderLockError(f"cannot lock {str(self.path)!r}: {exc.strerror or exc}") from None
            kernel = False
            note(f"the file system of {str(self.folder)!r} offers no file locks (flock: {exc.strerror}): the lock "
                 "file alone tells a second writer, which is refused while its holder runs")
        if not self._is_current(fd):
            return False
        previous = _read(fd)
        if previous is not None:
            if kernel:  # the flock was free: the process that wrote the record ended without releasing it
                why = "it ended without releasing it"
            else:
                alive, why = holder_alive(previous) if previous else (None, "its record is unreadable")
                if alive is not False:
                    raise self._busy(fd, f" ({why}: remove the lock file if it no longer runs)" if why else "")
            note(f"taking over the stale lock of {str(self.folder)!r} left by {describe_holder(previous)}: {why}")
        elif not kernel and not created:  # another process created it a moment ago and writes its record now
            raise self._busy(fd, " (remove the lock file if no command writes the folder)")
        data = (json.dumps(holder_record(self.command)) + "\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except OSError as exc:
            raise FolderLockError(f"cannot write the lock file {str(self.path)!r}: {exc.strerror or exc}") from None
        return True

    def release(self) -> None:
        """Remove the lock file and drop the lock (a no-op when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._is_current(fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
