"""Who writes a report folder: ``FolderLock``, a lock file beside ``report.json``.

Two runs writing one folder at once would each replace the other's ``report.json``, and the one
that finished last would win without a word. So the run that writes ``report.json`` keeps
``.stallscope.lock`` in the folder while it runs: its process id, its host and a token of its
own (two scopes of one process have the same pid). It is advisory: a run that finds the file held
by another live run takes it over and says so in its report, and the run it took it from says
so when it ends (the file is no longer its own, or gone). A lock left by a run that died (same
host, its process gone) is taken over silently; one from another host cannot be checked, and is
named in the note as possibly stale. Every failure to read or write the file is ignored: a
folder that cannot be written is noted by the report's writer already.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

LOCK_NAME = ".stallscope.lock"

#: the most of the lock file read (a few dozen bytes are written)
_MAX_READ = 4096


class FolderLock:
    """The lock of one run on its report folder (see the module docstring)."""

    def __init__(self, folder: Path, host: str) -> None:
        self.path = folder / LOCK_NAME
        self._mine = {"pid": os.getpid(), "host": host, "token": secrets.token_hex(8)}
        #: the claim was tried (once a run), and the lock file written
        self.claimed = False
        self._held = False

    def claim(self) -> str | None:
        """Write the lock; a note when another live run held it (and may still write here)."""
        if self.claimed:
            return None
        self.claimed = True
        other = self._read()
        tmp = self.path.with_name(f"{LOCK_NAME}.{self._mine['token']}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._mine), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:  # a full disk, a folder that cannot be written: no lock, nothing left
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return None
        self._held = True
        if other is None or not self._alive(other):
            return None
        return (
            f"another run ({_who(other)}) was writing this report folder when this one began; "
            "report.json holds whichever run finished last"
        )

    def release(self) -> str | None:
        """Remove the lock if it is still this run's; a note when another run took it meanwhile."""
        if not self._held:
            return None
        self._held = False
        other = self._read()
        if other is not None and other.get("token") == self._mine["token"]:
            with contextlib.suppress(OSError):
                self.path.unlink()
            return None
        if other is None:
            try:
                gone = self.path.parent.is_dir()  # the lock, not the whole folder
            except OSError:
                gone = False
            if gone:
                return "this run's lock on its report folder was removed while it ran (another run writing there?)"
            return None
        return (
            f"another run ({_who(other)}) began writing this report folder while this one ran; "
            "report.json holds whichever run finished last"
        )

    def _read(self) -> dict[str, object] | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.loads(fh.read(_MAX_READ))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _alive(self, other: dict[str, object]) -> bool:
        """Whether the run that wrote ``other`` may still be running."""
        if other.get("token") == self._mine["token"]:
            return False
        pid = other.get("pid")
        if other.get("host") != self._mine["host"] or not isinstance(pid, int) or isinstance(pid, bool):
            return True  # another host: cannot tell
        if pid <= 0:
            return False  # not a process
        if pid == self._mine["pid"]:
            return True  # another scope of this process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except (OSError, ValueError, OverflowError):
            return True  # alive, not ours to signal
        return True


def _who(other: dict[str, object]) -> str:
    return f"pid {other.get('pid')!s:.20} on host {other.get('host')!s:.100}"
