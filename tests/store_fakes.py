"""A dict in place of a job's rendezvous store (``torch.distributed.Store``), for the exchange of
the ranks' summaries (``hooks/distributed.py``) and a tune trial's stop (``tune/trial.py``)."""

from __future__ import annotations


class DictStore:
    """The part of ``torch.distributed.Store`` StallScope uses; ``checks`` counts lookups."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.checks = 0

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None
