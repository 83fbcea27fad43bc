"""Types of the timeline's hot path in C (``_native.c``); ``recorder.py`` has its Python twin."""

from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

LEAVE: int
STEP: int
WAIT: int
GOT: int
NONE: int
END: int
DATA_ID: int
COMPUTE_ID: int
OTHER_ID: int
FETCH_BEGIN: int
FETCH_END: int
COMPUTE_BEGIN: int
COMPUTE_END: int

class EventLog:
    """The timeline's event log: (code, timestamp) pairs as C ints; what recorder.py uses of a list."""

    #: the thread whose ``Timer`` phases are logged (0: any thread)
    owner: int
    #: the first other thread that entered or left a phase (0: none)
    foreign: int

    def __init__(self, values: Iterable[int] = ..., /) -> None: ...
    def extend(self, values: Iterable[int], /) -> None: ...
    def copy(self) -> list[int]: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> int: ...

def order_stats(values: array[int], /) -> tuple[int, float, float, float, float, float] | None:
    """``stats.Distribution.of``'s numbers (n, mean, p10, p50, p90, max, in seconds) of a
    non-empty ``array('q')`` of nanoseconds, each the same double as Python's; None where the
    sum passes 2**53 (Python divides it exactly), or a sum or difference passes 64 bits."""

def fold(timeline: object, events: EventLog | list[int], upto: int = ..., /) -> None:
    """``recorder.Timeline._fold_events`` in C: apply ``events`` (the first ``upto`` entries, an
    even number; all by default) to the timeline's folded state. They are taken out of an
    ``EventLog`` first; the rest stay, in order."""

class Timer:
    """``recorder.PhaseTimer`` in C."""

    #: where events go: the log itself, or a callable given each event as (code, now)
    target: EventLog | Callable[[tuple[int, int]], object]
    #: the log whose length triggers ``timeline._fold()`` after a leave
    log: EventLog
    def __init__(
        self,
        code: int,
        target: EventLog | Callable[[tuple[int, int]], object],
        log: EventLog,
        clock: Callable[[], int],
        timeline: object,
        fold_at: int,
    ) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *exc_info: object) -> None: ...

class Stream(Iterator[T]):
    """``recorder.Timeline._stream`` in C."""

    def __init__(
        self,
        it: Iterator[T],
        log: EventLog,
        clock: Callable[[], int],
        cpu_clock: Callable[[], int],
        switch_clock: Callable[[], int],
        timeline: object,
        on_first: Callable[[T, int], None],
        result: list[int],
        token: list[object],
        cpu_due: int,
        interval: int,
        fold_at: int,
    ) -> None: ...
    def __next__(self) -> T: ...

class StepHook:
    """One of Lightning's per-step touch points (``hooks/lightning.py``): calls ``inner`` and
    moves the fit's state in its usual case, calls ``slow`` in any other."""

    inner: Callable[..., object]
    def __init__(
        self,
        kind: int,
        inner: Callable[..., object],
        slow: Callable[..., None],
        run: object,
        scope: object,
        timeline: object,
        h2d: int,
        compute: int,
        fold_at: int,
        interval: int,
    ) -> None: ...
    def __call__(self, *args: object, **kwargs: object) -> object: ...

class HookBase:
    """A base class whose ``on_*`` attributes set to None on the instance read without a type
    lookup (StallScope's Lightning callback, ``hooks/lightning.py``)."""
