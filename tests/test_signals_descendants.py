"""Listing a process's descendants from /proc: in full, then only the ids handed out since."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.signals.descendants import CHILDLESS_RECHECK, ProcDescendants

ROOT = 100


class FakeProc:
    """A scripted /proc: ``add`` a process or a thread, ``kill`` one, move the last id handed out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "sys" / "kernel").mkdir(parents=True)
        (path / "self").mkdir()
        (path / "self" / "stat").write_text("")
        self.set_last(0)
        self.add(1, parent=0)
        self.add(ROOT, parent=1)

    def set_last(self, pid: int) -> None:
        (self.path / "sys" / "kernel" / "ns_last_pid").write_text(f"{pid}\n")

    def add(self, pid: int, *, parent: int, start: int = 7, thread_of: int | None = None) -> None:
        """A process (or a thread of ``thread_of``, whose stat shows its process's parent)."""
        d = self.path / str(pid)
        d.mkdir(exist_ok=True)
        rest = " ".join(["0"] * 17 + [str(start)] + ["0"] * 30)
        # a name with a space and a parenthesis, as a real command name may have
        (d / "stat").write_text(f"{pid} (py thon) x) S {parent} {rest}\n")
        tgid = thread_of if thread_of is not None else pid
        (d / "status").write_text(f"Name:\tpython\nState:\tS\nTgid:\t{tgid}\nPid:\t{pid}\nPPid:\t{parent}\n")
        last = int((self.path / "sys" / "kernel" / "ns_last_pid").read_text())
        self.set_last(max(last, pid))

    def kill(self, pid: int) -> None:
        d = self.path / str(pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


class CountingDescendants(ProcDescendants):
    """Records which pids' stat files were read."""

    def __init__(self, proc: Path, **kwargs: int) -> None:
        super().__init__(ROOT, proc=proc, **kwargs)
        self.read: set[int] = set()

    def _stat(self, pid: int) -> tuple[int, int] | None:
        self.read.add(pid)
        return super()._stat(pid)


def test_a_full_listing_finds_children_and_their_children_only(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    proc.add(102, parent=101)
    proc.add(103, parent=1)  # not ours
    proc.add(104, parent=103)
    listing = ProcDescendants(ROOT, proc=tmp_path)
    assert listing.listing() == {101: True, 102: False}
    assert listing.full_listings == 1


def test_later_listings_read_only_the_known_descendants_and_the_ids_handed_out_since(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    for pid in range(2, 90):  # the rest of the machine
        proc.add(pid, parent=1)
    proc.add(101, parent=ROOT)
    listing = CountingDescendants(tmp_path)
    assert listing.listing() == {101: True}
    listing.read.clear()
    proc.add(120, parent=ROOT)
    proc.add(121, parent=ROOT, thread_of=120)  # a thread of the new worker: not a process
    proc.add(122, parent=120)  # the worker's own child
    proc.add(123, parent=1)  # someone else's
    assert listing.listing() == {101: True, 120: True, 122: False}
    assert listing.full_listings == 1
    # the known one and every id handed out since (some already gone), not the other 89 processes
    assert listing.read == {101, *range(102, 124)}
    listing.read.clear()
    assert listing.listing() == {101: True, 120: True, 122: False}
    # nothing new: the known ones, and once more the ids that had no /proc entry
    assert listing.read == {101, 120, 122, *range(102, 120)}
    listing.read.clear()
    assert listing.listing() == {101: True, 120: True, 122: False}
    assert listing.read == {101, 120, 122}


def test_an_exited_process_a_reused_id_and_an_orphan_drop_out(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    proc.add(102, parent=ROOT)
    proc.add(103, parent=ROOT)
    proc.add(104, parent=103)
    listing = ProcDescendants(ROOT, proc=tmp_path)
    assert listing.listing() == {101: True, 102: True, 103: True, 104: False}
    proc.kill(101)
    proc.kill(102)
    proc.add(102, parent=ROOT, start=9)  # the id went round to another process (started later)
    proc.kill(103)
    proc.add(104, parent=1)  # its parent exited: adopted by init
    assert listing.listing() == {}
    assert listing.full_listings == 1


def test_an_id_handed_out_before_its_proc_entry_appears_is_read_again(tmp_path: Path) -> None:
    """The kernel moves the last id on before ``/proc/<id>`` exists: that id is read once more."""
    proc = FakeProc(tmp_path)
    listing = ProcDescendants(ROOT, proc=tmp_path)
    assert listing.listing() == {}
    proc.set_last(130)  # handed out; the worker's /proc entry is not there yet
    assert listing.listing() == {}
    proc.add(130, parent=ROOT)  # there now, and no id handed out since
    assert listing.listing() == {130: True}
    assert listing.full_listings == 1


class FailingDescendants(ProcDescendants):
    """Reading ``fail``'s files raises ``error`` (``times`` times, then reads work again)."""

    def __init__(self, proc: Path, fail: int, error: OSError, times: int) -> None:
        super().__init__(ROOT, proc=proc)
        self.fail, self.error, self.times = fail, error, times

    def _read(self, pid: int, name: str) -> bytes:
        if pid == self.fail and self.times > 0:
            self.times -= 1
            raise self.error
        return super()._read(pid, name)


def test_a_read_that_fails_for_another_reason_drops_nobody(tmp_path: Path) -> None:
    """Too many open files is not a process gone: a full listing instead, and when that fails too,
    the error propagates (the host sampler turns itself off, with a note)."""
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    proc.add(102, parent=101)
    emfile = OSError(24, "Too many open files")
    listing = FailingDescendants(tmp_path, fail=101, error=emfile, times=0)
    assert listing.listing() == {101: True, 102: False}
    listing.times = 1  # the incremental listing's read of 101 fails, the full one's works
    assert listing.listing() == {101: True, 102: False}
    assert listing.full_listings == 2
    listing.times = 2  # both fail
    with pytest.raises(OSError, match="Too many open files"):
        listing.listing()


def test_another_users_process_that_cannot_be_read_is_not_ours(tmp_path: Path) -> None:
    """On a /proc mounted with ``hidepid=1`` other users' entries are listed but not readable."""
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    proc.add(150, parent=1)
    listing = FailingDescendants(tmp_path, fail=150, error=PermissionError(13, "Permission denied"), times=9)
    assert listing.listing() == {101: True}


def test_a_wrap_a_long_gap_and_every_nth_listing_list_everything(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    listing = ProcDescendants(ROOT, proc=tmp_path, span=50, full_every=4)
    listing.listing()
    assert listing.full_listings == 1
    proc.add(40, parent=ROOT)  # ids wrapped around: below the last one
    proc.set_last(40)
    assert listing.listing() == {101: True, 40: True}
    assert listing.full_listings == 2
    proc.add(95, parent=ROOT)
    proc.set_last(95)  # 55 ids since: more than the span
    assert listing.listing() == {101: True, 40: True, 95: True}
    assert listing.full_listings == 3
    for _ in range(3):
        listing.listing()
    assert listing.full_listings == 3
    listing.listing()
    assert listing.full_listings == 4  # the fourth listing since the last full one


def test_without_the_last_id_every_listing_is_full(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add(101, parent=ROOT)
    (tmp_path / "sys" / "kernel" / "ns_last_pid").unlink()
    assert not ProcDescendants.available(tmp_path)
    listing = ProcDescendants(ROOT, proc=tmp_path)
    for _ in range(3):
        assert listing.listing() == {101: True}
    assert listing.full_listings == 3


@pytest.mark.skipif(not ProcDescendants.available(), reason="needs Linux's /proc")
def test_real_children_and_grandchildren_as_psutil_lists_them() -> None:
    import psutil

    def psutil_listing() -> dict[int, bool]:
        return {p.pid: p.ppid() == os.getpid() for p in psutil.Process().children(recursive=True)}

    listing = ProcDescendants(os.getpid(), span=100_000)  # other jobs on the host may fork meanwhile
    before = listing.listing()
    full = listing.full_listings  # 0 when this process had no child (nothing to list), else 1
    assert before == psutil_listing()
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'input()']).wait()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while len(psutil_listing()) < len(before) + 2:  # the grandchild is up
            assert time.monotonic() < deadline
            time.sleep(0.01)
        now = listing.listing()
        assert listing.full_listings == full  # found without reading every process
        assert now == psutil_listing()
        assert now[child.pid] is True
        assert sorted(now.values()).count(False) >= 1
    finally:
        child.communicate(b"\n", timeout=30)
    assert listing.listing() == psutil_listing() == before


def test_a_root_with_no_child_is_not_listed_in_full_and_its_first_child_is_found(tmp_path: Path) -> None:
    """The first listing of a process with no child reads nothing (the kernel said so); the next
    one reads the ids handed out since, as any later listing does."""
    proc = FakeProc(tmp_path)
    for pid in range(2, 90):  # the rest of the machine
        proc.add(pid, parent=1)
    listing = CountingDescendants(tmp_path)
    listing._childless = lambda: True
    assert listing.listing() == {}
    assert listing.read == set()
    assert listing.full_listings == 0
    proc.add(120, parent=ROOT)
    proc.add(121, parent=120)
    assert listing.listing() == {120: True, 121: False}
    assert listing.full_listings == 0
    # the ids since, and the last few before the first listing (a fork that raced it)
    assert listing.read == set(range(100 - CHILDLESS_RECHECK + 1, 122))


@pytest.mark.skipif(not ProcDescendants.available(), reason="needs Linux's /proc")
def test_the_kernel_tells_whether_this_process_has_children() -> None:
    """In a fresh process: no child, so the first listing reads nothing; with a child (even one
    that exited and was not reaped), the first listing is a full one and finds it."""
    code = (
        "import os, subprocess, sys\n"
        "from stallscope.signals.descendants import CHILDLESS_RECHECK, ProcDescendants, has_no_children\n"
        "alone = has_no_children()\n"
        "first = ProcDescendants(os.getpid()); found = first.listing()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
        "os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped\n"
        "second = ProcDescendants(os.getpid()); again = second.listing()\n"
        "alone_after = has_no_children()\n"
        "print(alone, found, first.full_listings, alone_after, again == {child.pid: True}, second.full_listings)\n"
        "child.wait()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "{}", "0", "False", "True", "1"]
