"""The live descendants of a process (DataLoader workers and what they spawn), read from Linux's /proc.

A full listing reads the status of every process on the machine (one file each: about 1 ms for 65
processes on a small VM, far more on a big host), so the host sampler could afford it only once a
second or less. But the kernel hands out process ids in increasing order, and
``/proc/sys/kernel/ns_last_pid`` tells the last one handed out: a listing only needs to read the
ids handed out since the previous one, plus the descendants it already knows (still there? the
same process?). Between two ticks that is usually a handful of files.

The first call lists every process too, unless the process has no child at all (``waitid``
with ``WNOHANG | WNOWAIT`` says so in one system call and reaps nothing: the usual case when a
run starts, before its DataLoader's workers): then there is nothing to find, and the next call
reads only the ids handed out since, and the last few before (``CHILDLESS_RECHECK``: the kernel
hands an id out a moment before the new process becomes a child).

A full listing happens on the first call, when the ids wrapped around, when more than ``span``
ids were handed out in between (reading each would cost more than reading every process), and
every ``full_every`` listings, which also catches what the incremental path cannot see: a
process adopted by this one as a child subreaper.

Threads draw their ids from the same counter. ``/proc/<tid>/stat`` answers for a thread too, with
its process's parent, so a new id whose parent is one of ours is checked to be a process
(``Tgid`` in its ``status``) before it counts.

The kernel hands an id out a moment before ``/proc/<id>`` appears: an id of the range that was not
there yet is read again at the next listing. A file that cannot be read for any other reason than
its process being gone (too many open files, say) is no sign of anything: the incremental listing
gives way to a full one, whose own such error propagates (the sampler then turns itself off with a
note). Ids that went all the way round between two listings look like a short range; the
periodic full listing bounds what that can miss.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

#: ids handed out since the previous listing beyond which a full listing is cheaper
INCREMENTAL_SPAN = 256
#: every this many listings, a full one
FULL_EVERY = 64
#: after a first listing that found no child, the next one also reads this many ids before it
CHILDLESS_RECHECK = 16
#: a stat or status file is read in one ``read`` of this many bytes (they hold about 300 and 1,500)
_READ_BYTES = 8192
#: what a read of /proc/<pid>/... raises when there is no such process, or it is not ours (another
#: user's, under ``hidepid``), or its file is not what was expected; any other ``OSError`` is not
#: a sign of anything and propagates
_NOT_OURS = (FileNotFoundError, ProcessLookupError, PermissionError, ValueError, IndexError)


class ProcDescendants:
    """``listing()``: pid -> whether it is a direct child of ``root_pid``, for every live descendant."""

    def __init__(
        self,
        root_pid: int,
        *,
        proc: Path = Path("/proc"),
        span: int = INCREMENTAL_SPAN,
        full_every: int = FULL_EVERY,
        childless: Callable[[], bool] | None = None,
    ) -> None:
        """``childless``: whether the root has no child process now (for the first listing);
        by default asked of the kernel when the root is this process, else not known."""
        if childless is None and root_pid == os.getpid():
            childless = has_no_children
        self._childless = childless
        self._root = root_pid
        self._proc = proc
        self._root_dir = os.fspath(proc)
        self._span = span
        self._full_every = full_every
        #: pid -> (start time in clock ticks since boot: tells a reused pid apart, direct child)
        self._known: dict[int, tuple[int, bool]] = {}
        #: the last id handed out when the previous listing began
        self._last: int | None = None
        self._since_full = 0
        #: ids of the previous range that had no /proc entry yet (or were gone): read once more
        self._missing: list[int] = []
        #: full listings so far (every process read)
        self.full_listings = 0

    @staticmethod
    def available(proc: Path = Path("/proc")) -> bool:
        """Whether this machine has what the listing reads (Linux with /proc mounted)."""
        last_pid = ProcDescendants._read_int(proc / "sys" / "kernel" / "ns_last_pid")
        return last_pid is not None and (proc / "self" / "stat").exists()

    def listing(self) -> dict[int, bool]:
        last = self._read_int(self._proc / "sys" / "kernel" / "ns_last_pid")
        previous, self._last = self._last, last
        self._since_full += 1
        if previous is None and last is not None and self._childless is not None and self._childless():
            # no child now (asked after the last id was read): a descendant will have a later id,
            # or one of the last few (a fork in another thread may hold its id a moment before it
            # becomes a child): the next listing reads those again
            self._last = max(0, last - CHILDLESS_RECHECK)
            self._known = {}
            self._since_full = 0
            return {}
        if (
            last is None
            or previous is None
            or not 0 <= last - previous <= self._span
            or self._since_full >= self._full_every
        ):
            self._list_all()
        else:
            try:
                self._list_new(previous, last)
            except OSError:  # not a process gone: the reads themselves fail; list everything
                self._list_all()
        return {pid: direct for pid, (_, direct) in self._known.items()}

    # -- the two ways ----------------------------------------------------------------------

    def _list_all(self) -> None:
        self._since_full = 0
        self._missing = []
        self.full_listings += 1
        stats: dict[int, tuple[int, int]] = {}
        for name in os.listdir(self._proc):  # processes only: threads are not listed
            if name.isdigit():
                stat = self._stat(int(name))
                if stat is not None:
                    stats[int(name)] = stat
        self._known = self._tree(stats)

    def _list_new(self, previous: int, last: int) -> None:
        stats: dict[int, tuple[int, int]] = {}
        for pid, (start, _) in self._known.items():
            stat = self._stat(pid)
            if stat is not None and stat[1] == start:  # not gone, nor its id reused by another process
                stats[pid] = stat
        missing: list[int] = []
        # in order: a child's id comes before its own children's
        for pid in sorted({*self._missing, *range(previous + 1, last + 1)}):
            if pid in stats:
                continue
            stat = self._stat(pid)
            if stat is None:
                missing.append(pid)
            elif stat[0] == self._root or stat[0] in stats:
                tgid = self._tgid(pid)
                if tgid is None:
                    missing.append(pid)
                elif tgid == pid:  # a thread of one of ours has its process's parent, and another Tgid
                    stats[pid] = stat
        self._known = self._tree(stats)
        # read again next time, once: ids of this range only, so the list stays within the span
        self._missing = [pid for pid in missing if pid > previous]

    def _tree(self, stats: dict[int, tuple[int, int]]) -> dict[int, tuple[int, bool]]:
        """The descendants of the root among ``stats`` (pid -> (parent pid, start time)): a process
        whose parent exited was adopted by another and is no longer one, as in a full listing."""
        children: defaultdict[int, list[int]] = defaultdict(list)
        for pid, (parent, _) in stats.items():
            children[parent].append(pid)
        known: dict[int, tuple[int, bool]] = {}
        todo = [self._root]
        while todo:
            parent = todo.pop()
            for pid in children.get(parent, ()):
                if pid not in known and pid != self._root:
                    known[pid] = (stats[pid][1], parent == self._root)
                    todo.append(pid)
        return known

    # -- reading /proc ---------------------------------------------------------------------

    def _stat(self, pid: int) -> tuple[int, int] | None:
        """(parent pid, start time) of ``pid``; None when there is no such process, or it is not
        readable (another user's, on a /proc mounted with ``hidepid``: not one of ours). Any other
        ``OSError`` propagates."""
        try:
            data = self._read(pid, "stat")
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ")"
            fields = data[data.rindex(b")") + 2 :].split()
            return int(fields[1]), int(fields[19])
        except _NOT_OURS:
            return None

    def _tgid(self, pid: int) -> int | None:
        """The process ``pid`` belongs to (``pid`` itself unless it is a thread); None as ``_stat``."""
        try:
            for line in self._read(pid, "status").splitlines():
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
        except _NOT_OURS:
            return None
        return None

    def _read(self, pid: int, name: str) -> bytes:
        # os.open and one os.read of a string path: a full listing reads a file per process on the
        # machine, and a ``Path`` and a buffered file object per read took twice as long
        fd = os.open(f"{self._root_dir}/{pid}/{name}", os.O_RDONLY)
        try:
            return os.read(fd, _READ_BYTES)
        finally:
            os.close(fd)

    @staticmethod
    def _read_int(path: Path) -> int | None:
        try:
            with open(path, "rb") as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None


def has_no_children() -> bool:
    """Whether this process has no child process, living or waiting to be reaped: ``waitid`` on
    any child, without waiting (``WNOHANG``) and without reaping (``WNOWAIT``), fails with
    ``ECHILD`` exactly then. False when it cannot tell."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except (OSError, AttributeError):  # AttributeError: no waitid here (not Linux)
        return False
    return False
