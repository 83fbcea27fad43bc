"""StallScope's background threads take no process signals (``stallscope/_threads.py``)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from stallscope import StallScope
from stallscope._threads import start_quiet

#: signals a training process relies on reaching its own threads
USERS = {signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM}


def _blocked(native_id: int) -> set[int]:
    """The signals a thread of this process blocks, from the kernel's own view of it."""
    for line in Path(f"/proc/self/task/{native_id}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError("no SigBlk line")


def test_a_quiet_thread_blocks_every_signal_and_its_starter_keeps_its_own() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: list[set[signal.Signals]] = []
    thread = threading.Thread(target=lambda: seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    start_quiet(thread)
    thread.join(5)
    assert seen[0] >= USERS
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_stallscopes_threads_leave_the_process_signals_to_the_users_threads(tmp_path: Path) -> None:
    """A DataLoader worker's death (SIGCHLD) went to StallScope's sampler thread once: the main
    thread, waiting in the loader's ``queue.get(timeout=60)``, was not woken and reported the
    dead worker 60 s late."""
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(range(3)):
            pass
        ours = [t for t in threading.enumerate() if t.name.startswith("stallscope-") and t.native_id is not None]
        assert ours  # the host sampler at least
        for thread in ours:
            assert thread.native_id is not None
            assert {int(s) for s in USERS} <= _blocked(thread.native_id), thread.name
        main = threading.main_thread().native_id
        assert main is not None
        assert not {int(s) for s in USERS} & _blocked(main)


def test_a_signal_handled_while_the_mask_changes_leaves_the_starters_mask_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each change of the mask also runs the handlers of signals already pending: a Ctrl-C then
    raises inside it, after the mask changed. The thread that started the other keeps its own
    signals (a training thread with every signal blocked would pass that on to its loader's
    workers)."""
    import stallscope._threads as threads_module

    real = signal.pthread_sigmask

    class Masks:
        def pthread_sigmask(self, how: int, signals: object) -> object:
            previous = real(how, signals)  # type: ignore[arg-type]
            if how == signal.SIG_BLOCK and signals:
                raise KeyboardInterrupt  # a pending Ctrl-C, handled as the call ends
            return previous

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    monkeypatch.setattr(threads_module, "_masks", Masks())
    thread = threading.Thread(target=lambda: None)
    with pytest.raises(KeyboardInterrupt):
        start_quiet(thread)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
