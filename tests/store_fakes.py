"""A dict in place of a job's rendezvous store (``torch.distributed.Store``), for the exchange of
the ranks' summaries (``hooks/distributed.py``) and a tune trial's stop (``tune/trial.py``)."""

from __future__ import annotations


class QueueEmptyError(RuntimeError):
    """As torch's ``torch.distributed.QueueEmptyError``."""


class DictStore:
    """The part of ``torch.distributed.Store`` StallScope uses; ``checks`` counts lookups,
    ``trips`` every call (a round trip to a real store). ``queues=False``: a store without
    queues, whose queue calls raise ``NotImplementedError`` (as ``FileStore``'s)."""

    def __init__(self, *, queues: bool = True) -> None:
        self.data: dict[str, bytes] = {}
        self.queued: dict[str, list[bytes]] = {}
        self.has_queues = queues
        self.checks = 0
        self.trips = 0

    def empty(self) -> bool:
        """Nothing left in it: every key taken, every queue popped."""
        return not self.data and not any(self.queued.values())

    def queue_push(self, key: str, value: bytes) -> None:
        self.trips += 1
        if not self.has_queues:
            raise NotImplementedError("queue support is not implemented.")
        self.queued.setdefault(key, []).append(value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        self.trips += 1
        if not self.has_queues:
            raise NotImplementedError("queue support is not implemented.")
        if not self.queued.get(key):
            raise QueueEmptyError("queue is empty")
        return self.queued[key].pop(0)

    def set(self, key: str, value: bytes) -> None:
        self.trips += 1
        self.data[key] = value

    def get(self, key: str) -> bytes:
        self.trips += 1
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self.trips += 1
        self.checks += 1
        return all(k in self.data or self.queued.get(k) for k in keys)

    def delete_key(self, key: str) -> bool:
        self.trips += 1
        return self.data.pop(key, None) is not None
