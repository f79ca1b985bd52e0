"""The writer lock of an output folder (sim.folder_lock, sim.cli.writer_lock), with real processes as holders.

A held folder is refused naming its holder (pid, host, start, command line); the lock file is removed on release,
on an error and on Ctrl-C; a lock left by a killed holder, or naming a process that is gone, is taken over with a
note. Where the file system has no ``flock`` the lock file's record decides: a dead pid, a reused pid and a
restarted machine are stale, a live holder and one on another host are not."""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sim import cli, folder_lock
from sim.folder_lock import LOCK_NAME, FolderBusyError, FolderLock

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys; from sim.folder_lock import FolderLock; lock = FolderLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); sys.stdin.read(); lock.release()")


def _holder(folder: Path) -> subprocess.Popen:
    """A process that holds the lock of ``folder`` until its stdin closes (it has taken it when this returns)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def _record(folder: Path) -> dict:
    return json.loads((folder / LOCK_NAME).read_text())


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_lock_file_names_its_holder_and_goes_with_the_lock(tmp_path):
    lock = FolderLock(tmp_path, command="prefalign verify sweep H.9 --seeds 0:2 --out x")
    t0 = datetime.datetime.now().astimezone().replace(microsecond=0)
    lock.acquire()
    rec = _record(tmp_path)
    assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
    assert rec["command"] == "prefalign verify sweep H.9 --seeds 0:2 --out x"
    assert t0 <= datetime.datetime.fromisoformat(rec["started"]) <= datetime.datetime.now().astimezone()
    start = folder_lock.process_start(os.getpid())
    assert rec["process_start"] == (start[0] if start else None)
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists() and not lock.held
    with FolderLock(tmp_path):  # free again
        assert (tmp_path / LOCK_NAME).is_file()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_held_by_another_process_is_refused_naming_it(tmp_path):
    holder = _holder(tmp_path)
    try:
        rec = _record(tmp_path)
        with pytest.raises(FolderBusyError) as info:
            FolderLock(tmp_path).acquire()
        msg = str(info.value)
        assert f"is being written by pid {holder.pid} on host {socket.gethostname()} since {rec['started']} (" in msg
        assert "python -c 'import sys; from sim.folder_lock import FolderLock" in msg and "\n" not in msg
        assert info.value.holder == rec
        assert _record(tmp_path) == rec  # the refused process leaves the holder's lock as it was
    finally:
        holder.communicate("")
    assert holder.returncode == 0 and not (tmp_path / LOCK_NAME).exists()
    with FolderLock(tmp_path):
        pass


def _taken_over(folder: Path, left: dict) -> None:
    """Take the lock of ``folder`` whose lock file holds the record ``left``: a note names the process that left it."""
    notes: list[str] = []
    lock = FolderLock(folder)
    lock.acquire(note=notes.append)
    assert _record(folder)["pid"] == os.getpid()
    assert notes == [f"taking over the stale lock of {str(folder)!r} left by pid {left['pid']} on host {left['host']} "
                     f"since {left['started']} ({left['command']}): it ended without releasing it"]
    lock.release()


def test_the_lock_of_a_killed_holder_is_taken_over_with_a_note(tmp_path):
    holder = _holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    left = _record(tmp_path)  # the killed process could not remove its lock file
    assert left["pid"] == holder.pid
    _taken_over(tmp_path, left)


def test_a_lock_file_naming_a_dead_pid_is_taken_over(tmp_path):
    left = {**folder_lock.holder_record("prefalign llm sweep --out x"), "pid": _dead_pid()}
    (tmp_path / LOCK_NAME).write_text(json.dumps(left))
    _taken_over(tmp_path, left)


# ------------------------------------------------------------------------- a file system without flock

@pytest.fixture
def no_flock(monkeypatch):
    """A file system without locks (Lustre mounted noflock, some FUSE file systems): flock fails with ENOLCK. Such a
    file system is not at hand in a test; the lock's answer to that error is what is tested."""

    def flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", flock)


def _own(**change) -> dict:
    return {**folder_lock.holder_record("prefalign verify search --out x"), **change}


STALE = {
    "dead pid": (lambda: _own(pid=_dead_pid()), lambda rec: f"pid {rec['pid']} is no longer running"),
    "reused pid": (lambda: _own(process_start=_own()["process_start"] - 1),
                   lambda rec: f"pid {os.getpid()} is now another process (started at another time)"),
    "restarted machine": (lambda: _own(boot_id="another-boot"), lambda rec: "the machine has restarted since"),
}


@pytest.mark.skipif(folder_lock.process_start(os.getpid()) is None, reason="no /proc: start times unknown")
@pytest.mark.parametrize("make, why", STALE.values(), ids=STALE)
def test_without_flock_a_record_of_a_process_that_is_gone_is_taken_over(tmp_path, no_flock, make, why):
    rec = make()
    (tmp_path / LOCK_NAME).write_text(json.dumps(rec))
    notes: list[str] = []
    lock = FolderLock(tmp_path)
    lock.acquire(note=notes.append)
    assert _record(tmp_path)["pid"] == os.getpid()
    lock.release()
    assert len(notes) == 2 and "offers no file locks (flock: " in notes[0]
    assert notes[1].startswith(f"taking over the stale lock of {str(tmp_path)!r} left by pid {rec['pid']} on host ")
    assert notes[1].endswith(f"(prefalign verify search --out x): {why(rec)}")


BUSY = {
    "live holder": (lambda: _own(), "is being written by pid"),
    "another host": (lambda: _own(host="elsewhere"), "it ran on host 'elsewhere', which cannot be checked from here: "
                                                     "remove the lock file if it no longer runs"),
}


@pytest.mark.parametrize("make, match", BUSY.values(), ids=BUSY)
def test_without_flock_a_live_or_unknowable_holder_is_refused(tmp_path, no_flock, make, match):
    rec = make()
    (tmp_path / LOCK_NAME).write_text(json.dumps(rec))
    with pytest.raises(FolderBusyError, match=match):
        FolderLock(tmp_path).acquire()
    assert _record(tmp_path) == rec


def test_without_flock_a_new_lock_file_is_created_exclusively(tmp_path, no_flock):
    notes: list[str] = []
    lock = FolderLock(tmp_path)
    lock.acquire(note=notes.append)
    assert _record(tmp_path)["pid"] == os.getpid() and len(notes) == 1
    with pytest.raises(FolderBusyError, match=f"pid {os.getpid()}"):  # this process is alive: refused
        FolderLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


# ------------------------------------------------------------------------------ the command lines' helper


def test_writer_lock_is_a_one_line_usage_error_and_is_released_however_the_block_ends(tmp_path, capsys):
    out = tmp_path / "new" / "out"
    with cli.writer_lock(out, "--out") as p:  # created like check_writable_dir
        assert p == out and (out / LOCK_NAME).is_file()
        with pytest.raises(cli.UsageError) as info, cli.writer_lock(out, "--out"):
            pass
        assert str(info.value).startswith(f"argument --out: {str(out)!r} is being written by pid {os.getpid()} ")
        assert str(info.value).endswith(f"one writer per folder (lock file {str(out / LOCK_NAME)!r})")
    assert not (out / LOCK_NAME).exists()
    for exc in (RuntimeError("a failing command"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), cli.writer_lock(out, "--out"):
            assert (out / LOCK_NAME).is_file()
            raise exc
        assert not (out / LOCK_NAME).exists()
    assert capsys.readouterr().err == ""


def test_writer_lock_says_when_it_takes_over_a_stale_lock(tmp_path, capsys):
    (tmp_path / LOCK_NAME).write_text(json.dumps(_own(pid=_dead_pid())))
    with cli.writer_lock(tmp_path, "--out"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: taking over the stale lock of {str(tmp_path)!r} left by pid")


def test_the_command_line_as_typed():
    assert folder_lock.command_line(["/v/bin/python", "-m", "verification", "sweep", "--out", "a b"]) == \
        "python -m verification sweep --out 'a b'"
    assert folder_lock.command_line(["/v/bin/python3.11", "/v/bin/prefalign", "llm", "sweep"]) == \
        "prefalign llm sweep"
    assert folder_lock.command_line(["/v/bin/python", "-c", "pass"]) == "/v/bin/python -c pass"
