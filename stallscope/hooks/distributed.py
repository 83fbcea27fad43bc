"""Distributed jobs (SPEC §3a): which rank this is, and rank 0's gather of the ranks' summaries.

Every rank records its own timeline, exactly as a single process does: nothing here runs per
step. At each epoch end (and once at the end of the run) a rank hands its summary to a ``Job``:

* a rank other than 0 keeps its epoch's summary and posts its epochs for rank 0 in batches (with
  its run's summary, every ``run_every``-th epoch) and goes on; it prints nothing;
* rank 0 takes the others' summaries and turns them into the job's epochs and report
  (``report/job.py``, ``analysis/job.py``), which the session prints and writes as
  ``<report_dir>/report.json``.

Batches, and when rank 0 may wait for one
    An exchange costs each side a round trip to the store (about 0.15 ms of CPU between training
    steps, whose work has left the caches cold), and reading a summary costs rank 0 more than
    it does warm: with epochs of a few tens of milliseconds, a rank's epoch end was mostly the
    exchange. So a rank posts at the epochs of its run summaries (multiples of ``run_every``),
    at most ``MAX_BATCH`` epochs apart: one post of all its epochs since the last. Rank 0 must
    never wait for a post a rank has not made yet, since that rank may itself be waiting for rank
    0 in the next step's collective. So each post says at which epoch end the rank posts next
    (``next``: it posts then whatever happens, sooner when its ``run_every`` came down), and is
    numbered (``post0``, ``post1``, ...: rank 0 takes them in order). Rank 0 waits only for a
    post a rank said it makes at an epoch end it has already passed (rank 0's previous one; its
    current one where something needs the job's numbers now: ``Job.settle``), and otherwise
    looks without waiting. The job's epochs are made as the ranks' summaries of them come in,
    and its panels wait for them (``Session._close_job_epoch``).

Each rank's session writes its own ``<report_dir>/ranks/rank-<R>.json``, and rank 0 the job's
report, on the report writer's budget (``Session._close_job_epoch``), in full at the end.

No file is written by two processes, and nothing assumes the ranks share a file system: the
summaries travel over the job's own ``torch.distributed`` rendezvous store.

Besides its summaries a rank sends its forward passes (``signals/forward.py``: a compute
straggler's evidence), its node rank, its machine's identity (``HostId``; the ranks on one machine
share its cores: ``Job.ranks_on_host``) and its load (``Job.load_notes``). A run that ends with
its own exception, or a SIGTERM (``TermGuard``), waits for no other rank (``Job.stop_waiting``).

Why the store, not a collective
    The job's process group already has a key-value store (the ``TCPStore`` its ranks met at),
    reachable from every rank on every node. A rank posts its summary with one ``set`` and goes on;
    rank 0 polls for the keys with a deadline. So:

    * nothing ever waits on a rank that died, crashed or ran a different number of epochs: a rank
      posts a ``final`` key when its run ends (also after an exception), and rank 0 stops waiting
      for a rank once it sees it; a rank that sends nothing before ``timeout_s`` is noted and not
      waited for again (its late summaries are still taken when they arrive);
    * it works whatever the backend (gloo, NCCL, ...), needs no side group (``new_group`` is itself
      a collective every rank must enter in the same order as the user's own groups) and puts
      nothing on the device or on the collective stream;
    * a gather (``gather_object``) would block every rank until all arrive, and a timed-out gloo
      group cannot be used again.

    The store is reached through ``torch.distributed.distributed_c10d._get_default_store``, the one
    private name used here (``default_store``); ``tests/test_hooks_distributed.py`` checks it
    exists in the installed torch. Without it, or when ``torch.distributed`` is not initialised
    (a job launched by ``torchrun`` that never calls ``init_process_group``), ranks still keep to
    their own files and rank 0 alone prints, with a note that the others were not gathered.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from stallscope._threads import start_quiet
from stallscope.analysis.disturbance import MIN_SAMPLED_S, OTHERS_SHARE
from stallscope.analysis.finding import Finding
from stallscope.analysis.job import RankWork, diagnose_job, uneven_steps, unseen_wait_note
from stallscope.analysis.numbers import count
from stallscope.report.job import consecutive_summary, job_summary, rank_entry
from stallscope.report.recent import RecentSteps, recent_from_dict, recent_to_dict
from stallscope.report.schema import (
    EpochReport,
    RankEntry,
    Report,
    Summary,
    finding_from_dict,
    finding_to_dict,
    summary_from_dict,
    summary_to_dict,
)
from stallscope.signals.host_sampler import HostSummary

#: seconds rank 0 waits at an epoch end for a rank's summary before it notes the rank as missing
GATHER_TIMEOUT_S = 10.0
#: rank 0's first wait between two looks for the ranks' summaries, doubled each time: ranks in
#: step post theirs within a millisecond of rank 0's look (their own epoch end's work), which a
#: first wait of a whole millisecond would add to every epoch end of the job
FIRST_POLL_S = 0.0001

#: the folder of each rank's own report, under ``report_dir``
RANKS_DIR = "ranks"

#: the prefix of StallScope's keys in the job's store
KEY_PREFIX = "stallscope"

#: payloads are versioned so ranks of different StallScope versions ignore each other's
PAYLOAD_VERSION = 2

#: most epochs of the job kept in its report (as ``Session.MAX_EPOCHS_IN_REPORT``)
MAX_JOB_EPOCHS = 500
#: most epoch summaries rank 0 keeps of a rank for the group of epochs being diagnosed together
#: (``Job._close_group``); past it, they are added up into one
MAX_GROUP_SPANS = 256

#: rank 0 takes the posts the ranks said they make at an epoch end at its own next one, unless
#: something needs the job's numbers sooner (``Job.close_epoch``)
MAX_DEFERRED = 1

#: most epochs a rank other than 0 sends in one post (its posts are at most this many epochs
#: apart: ``Job.post_every``)
MAX_BATCH = 16
#: most posts rank 0 takes from the store in one go (a bound, never reached by ranks in step)
MAX_POSTS_TAKEN = 64
#: most of its own epochs rank 0 keeps waiting for the ranks' summaries; past it the oldest is made
#: with what is in (ranks keep their word within ``MAX_BATCH`` epochs)
MAX_PENDING = 2 * MAX_BATCH + 2

#: a rank's run-level report (its summary and findings over the run so far, which rank 0 needs
#: for the job's report) is made and sent every ``run_every``-th epoch, a power of two chosen so
#: that making it takes at most this share of the epochs' time (``Job.note_run_cost``)
RUN_SHARE = 0.0025
#: ... but at least this often, in seconds of epochs (the job's mid-run report is never staler)
MAX_RUN_INTERVAL_S = 5.0

#: runs (``fit`` calls, scopes) that joined a job in this process; the same count on every
#: rank, so each run's keys are its own
_runs_joined = 0


@dataclass(frozen=True)
class RankInfo:
    """Where this process stands in a distributed job."""

    rank: int
    world_size: int
    #: rank on this host; None when the launcher did not say
    local_rank: int | None = None
    #: ranks on this host (torchrun's ``LOCAL_WORLD_SIZE``); None when the launcher did not say
    local_world_size: int | None = None
    #: the node's rank (torchrun's ``GROUP_RANK``, Lightning's ``NODE_RANK``); None when not said
    node_rank: int | None = None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def rank_info() -> RankInfo | None:
    """This process's rank: from ``torch.distributed`` when it is initialised, else from the
    launcher's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``. None for a single process."""
    rank: int | None = None
    world: int | None = None
    dist = _dist()
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                rank, world = int(dist.get_rank()), int(dist.get_world_size())
        except Exception:
            rank = world = None
    if rank is None or world is None:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world is None or world <= 1 or not 0 <= rank < world:
        return None
    local_world = _env_int("LOCAL_WORLD_SIZE")
    return RankInfo(
        rank=rank,
        world_size=world,
        local_rank=_env_int("LOCAL_RANK"),
        local_world_size=local_world if local_world and local_world <= world else None,
        node_rank=_env_int("GROUP_RANK") if _env_int("GROUP_RANK") is not None else _env_int("NODE_RANK"),
    )


#: files that tell machines apart (a host name may repeat: containers, cloned VMs)
MACHINE_ID_FILES = ("/proc/sys/kernel/random/boot_id", "/etc/machine-id")
#: the longest job whose ranks' machines each rank reads once (``Job.ranks_on_host``)
MAX_HOST_LOOKUP_RANKS = 256


class HostId:
    """This machine's identity, ``<hostname>/<boot id>`` (else the machine id, else the host name
    alone), read once on a thread of its own (a file under /proc is never read on the training
    thread); ``value`` is None until it is read."""

    def __init__(self, name: str, files: tuple[str, ...] = MACHINE_ID_FILES) -> None:
        self.name = name
        self.files = files
        self.value: str | None = None
        thread = threading.Thread(target=self.read, name="stallscope-host-id", daemon=True)
        start_quiet(thread)

    def read(self) -> None:
        for path in self.files:
            try:
                text = Path(path).read_text(encoding="ascii", errors="replace").strip()
            except OSError:
                continue
            if text:
                self.value = f"{self.name}/{text[:36]}"
                return
        self.value = self.name


def _dist() -> Any:
    """``torch.distributed`` when the user's code imported torch (never imported here on its own)."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except Exception:
        return None
    return dist


#: most modules looked at for an ``nn.DataParallel`` (a model's own modules, in order)
MAX_MODULES_SEARCHED = 10_000


def data_parallel_devices(model: object) -> int | None:
    """The GPUs an ``nn.DataParallel`` in ``model`` (or ``model`` itself) drives; None when it has
    none. Without torch imported there is none (nothing is imported here)."""
    if "torch" not in sys.modules:
        return None
    from torch import nn

    modules = model.modules() if isinstance(model, nn.Module) else ()
    for i, module in enumerate(modules):
        if i >= MAX_MODULES_SEARCHED:
            break
        if isinstance(module, nn.DataParallel):
            return len(module.device_ids or ())
    return None


def default_store() -> Any:
    """The private touch point: the default process group's rendezvous store, or None."""
    dist = _dist()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get is None:
        raise RuntimeError(
            "torch.distributed.distributed_c10d._get_default_store is gone from this torch; "
            "StallScope cannot gather the ranks' summaries"
        )
    return get()


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the exchange uses (tests plug a dict in)."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def delete_key(self, key: str) -> bool: ...


class Exchange:
    """Summaries over a key-value store: ranks ``post``, rank 0 ``collect`` s.

    Where the store has queues (``TCPStore``, torch's default rendezvous store, and
    ``HashStore``), a rank pushes its payload to its key's queue and rank 0 pops it without
    blocking: one round trip a payload where set, get and delete took three. Elsewhere
    (``FileStore``: its queue calls raise ``NotImplementedError``, on every rank alike) the key is
    set, and rank 0 checks, reads and deletes it.

    ``collect`` polls (no blocking ``wait``), first after ``FIRST_POLL_S``, backing off to
    ``max_poll_s``: one ``check`` of all the keys first (ranks in step: one round trip), then
    rank by rank; ``clock`` and ``sleep`` are injected for tests."""

    def __init__(
        self,
        store: Store,
        *,
        prefix: str,
        rank: int,
        world_size: int,
        timeout_s: float | None = None,
        max_poll_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = GATHER_TIMEOUT_S if timeout_s is None else timeout_s
        self.max_poll_s = max_poll_s
        self._clock = clock
        self._sleep = sleep
        #: ranks that missed a deadline (not waited for again) or posted their final summary
        self.late: set[int] = set()
        self.done: set[int] = set()
        #: the ranks whose payload the latest ``collect`` found (read or not)
        self.found: set[int] = set()
        #: whether payloads go through the store's queues (until a queue call says it has none)
        self.queues = callable(getattr(store, "queue_push", None)) and callable(getattr(store, "queue_pop", None))

    def key(self, rank: int, name: str) -> str:
        return f"{self.prefix}/rank{rank}/{name}"

    def post(self, name: str, payload: Mapping[str, Any]) -> None:
        raw = json.dumps(payload, separators=(",", ":")).encode()
        key = self.key(self.rank, name)
        if self.queues:
            try:
                self.store.queue_push(key, raw)  # type: ignore[attr-defined]
                return
            except NotImplementedError:  # a store without queues (FileStore): every rank alike
                self.queues = False
        self.store.set(key, raw)

    def take(self, key: str) -> tuple[bool, dict[str, Any] | None]:
        """(whether a payload was there, the payload when of this version) at ``key``, taken off
        the store: popped from its queue (one round trip), else checked, read and deleted."""
        if self.queues:
            try:
                raw = self.store.queue_pop(key, block=False)  # type: ignore[attr-defined]
            except NotImplementedError:
                self.queues = False
            except Exception as exc:  # torch's QueueEmptyError (a RuntimeError): nothing there
                if not _queue_empty(exc):
                    raise
                return False, None
            else:
                return True, _decode(raw)
        if not self.store.check([key]):
            return False, None
        raw = self.store.get(key)
        self.store.delete_key(key)
        return True, _decode(raw)

    def collect(
        self, name: str | Mapping[int, str], *, wait: bool = True, keep_late: bool = False
    ) -> dict[int, dict[str, Any]]:
        """Each other rank's payload at ``name`` (one name for every rank, or a name for each of
        some ranks: those only), or its ``final`` one when it has ended; waits until all are in
        or ``timeout_s`` passed, and notes the ranks still missing then as ``late``
        (``wait=False``: one look, no rank noted). A late rank whose payload is found is back in
        step, unless ``keep_late`` (the caller judges). A rank's missing payload is simply absent;
        ``found``: the ranks whose payload was there (read or not)."""
        names = dict(name) if isinstance(name, Mapping) else dict.fromkeys(range(self.world_size), name)
        got: dict[int, dict[str, Any]] = {}
        self.found = set()
        pending = [r for r in sorted(names) if r != self.rank and r not in self.done]
        start = self._clock()
        poll = FIRST_POLL_S
        while pending:
            wanted_keys = [self.key(r, names[r]) for r in pending]
            if len(pending) > 1 and self.store.check(wanted_keys):  # the usual case: all in step
                for r, key in zip(list(pending), wanted_keys, strict=True):
                    _, payload = self.take(key)
                    if payload is not None:
                        got[r] = payload
                    self.found.add(r)
                    if not keep_late:
                        self.late.discard(r)
                break
            for r in list(pending):
                for wanted in (names[r], "final"):
                    found, payload = self.take(self.key(r, wanted))
                    if found:
                        if payload is not None:
                            got[r] = payload
                        if wanted == "final":
                            self.done.add(r)
                        self.found.add(r)
                        pending.remove(r)
                        if not keep_late:
                            self.late.discard(r)
                        break
            waiting = [r for r in pending if r not in self.late]
            if not wait or not waiting or self._clock() - start >= self.timeout_s:
                if wait:
                    self.late.update(waiting)
                break
            self._sleep(poll)
            poll = min(poll * 2, self.max_poll_s)
        return got


def _decode(raw: bytes) -> dict[str, Any] | None:
    data = json.loads(bytes(raw).decode())
    return data if isinstance(data, dict) and data.get("v") == PAYLOAD_VERSION else None


def _queue_empty(exc: Exception) -> bool:
    """Whether ``exc`` is a store's "queue is empty" (torch's ``QueueEmptyError``)."""
    return type(exc).__name__ == "QueueEmptyError" or "queue is empty" in str(exc)


#: one of a rank's epochs not sent yet: its report, its forward passes in it (``ForwardStats.to_dict``;
#: empty when not timed) and the group of epochs its findings are of (None: it closes none)
Unsent = tuple[EpochReport, Mapping[str, Any], tuple[int, int] | None]


def _payload(
    info: RankInfo,
    host: str,
    *,
    name: str,
    batch: Sequence[Unsent],
    report: Report | None,
    run_every: int,
    next_post: int | None = None,
    ending: str | None = None,
    forward: Mapping[str, Any] | None = None,
    host_id: str | None = None,
    cores: int | None = None,
    load: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What a rank sends rank 0: its epochs' summaries and findings since its last post
    (``batch``), and its run's when ``report`` is given (every ``run_every``-th epoch, and at the
    end of the run); ``next_post``: the epoch at whose end it posts next (None in its final
    payload); ``ending``: how its run ended early (an exception), in its final payload;
    ``forward``: its forward passes in the run (``{"run": ...}``, as ``ForwardStats.to_dict``),
    where timed."""
    out: dict[str, Any] = {"v": PAYLOAD_VERSION, "rank": info.rank, "host": host, "name": name, "every": run_every}
    if next_post is not None:
        out["next"] = next_post
    if info.node_rank is not None:
        out["node"] = info.node_rank
    if host_id:
        out["host_id"] = host_id
    if cores:
        out["cores"] = cores
    if load:
        out["load"] = dict(load)
    if ending is not None:
        out["ending"] = ending
    if forward:
        out["forward"] = dict(forward)
    if report is not None:
        out["run_at"] = batch[-1][0].index if name != "final" and batch else None  # None: the end of the run
        out["epochs"] = len(report.epochs)
        out["run"] = {
            "summary": summary_to_dict(report.summary),
            "findings": [finding_to_dict(f) for f in report.findings],
        }
        out["notes"] = list(report.notes)
        if name == "final" and report.recent:  # its last steps, once: for the job's timeline
            out["recent"] = recent_to_dict(report.recent[0])
    items = []
    for epoch, epoch_forward, group in batch:
        item: dict[str, Any] = {
            "index": epoch.index,
            "summary": summary_to_dict(epoch.summary),
            "findings": [finding_to_dict(f) for f in epoch.findings],
        }
        if epoch_forward:
            item["forward"] = dict(epoch_forward)
        if group is not None:
            item["group"] = list(group)
        items.append(item)
    if items:
        out["batch"] = items
    return out


@dataclass(frozen=True)
class _Span:
    """One rank's summary and findings of a span, as rank 0 received them."""

    rank: int
    host: str
    summary: Summary
    findings: tuple[Finding, ...]
    epochs: int = 0
    #: its forward passes in the span (``ForwardStats.to_dict``); empty when not timed
    forward: Mapping[str, Any] = field(default_factory=dict)
    node_rank: int | None = None
    host_id: str = ""
    cores: int | None = None

    def work(self) -> RankWork:
        s = self.summary
        seconds = {name: share * s.wall_s for name, share in s.phase_fractions.items()}
        return RankWork(
            rank=self.rank,
            steps=s.steps,
            wall_s=s.wall_s,
            phase_seconds=seconds,
            findings=self.findings,
            host=self.host,
            epochs=self.epochs,
            forward_s=_per_step_s(self.forward, s.steps),
            cycle_s=_cycle_per_step_s(self.forward),
            stretch=_stretch(self.forward),
        )

    def entry(self) -> RankEntry:
        return rank_entry(
            self.rank,
            self.host,
            self.summary,
            self.epochs,
            forward=self.forward,
            node_rank=self.node_rank,
            host_id=self.host_id,
            cores=self.cores,
        )


def _at_least_0(value: Any) -> float | None:
    """``value`` as a float when it is a finite number of at least 0 (a rank's payload is input)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf:
        return float(value)
    return None


def _positive(value: Any) -> float | None:
    """``value`` as a float when it is a finite number above 0."""
    number = _at_least_0(value)
    return number if number is not None and number > 0 else None


def _cycle_per_step_s(forward: Mapping[str, Any]) -> float | None:
    """CPU seconds of the training thread's own work per step (``ForwardStats.cycle_s``), or None."""
    value = _positive(forward.get("cycle_per_step"))
    return None if value is None else value / 1e3


def _stretch(forward: Mapping[str, Any]) -> float:
    """How much the rank's machine stretched its forwards in wall time (at least 1; 1 when not
    said)."""
    value = _positive(forward.get("stretch", 1.0))
    return 1.0 if value is None else max(1.0, value)


def _per_step_s(forward: Mapping[str, Any], steps: int) -> float | None:
    """Seconds of forward per step: the typical pass (p50) times the passes per step, which a
    few passes slowed by something else (a page fault, a frequency dip) do not move; the mean
    where the median is not given."""
    numbers = {k: _at_least_0(forward.get(k)) for k in ("per_step", "p50", "calls")}
    p50, calls, per_step = numbers["p50"], numbers["calls"], numbers["per_step"]
    if p50 is None or calls is None:
        return None if per_step is None else per_step / 1e3
    if steps <= 0:
        return None
    value = p50 * calls / steps / 1e3
    return value if math.isfinite(value) else None


def _span(payload: Mapping[str, Any], part: str, data: Mapping[str, Any] | None = None) -> _Span:
    """A rank's span from its payload: its run (``part`` "run"), or one epoch of its batch (``part``
    "epoch", ``data`` the epoch's item)."""
    where = f"rank {payload.get('rank')} {part}"
    if data is None:
        data = payload[part]
        forward = payload.get("forward")
        forward = forward.get(part) if isinstance(forward, Mapping) else None
    else:
        forward = data.get("forward")
    node = payload.get("node")
    cores = payload.get("cores")
    return _Span(
        rank=int(payload["rank"]),
        host=str(payload.get("host", "")),
        summary=summary_from_dict(data["summary"], where),
        findings=tuple(finding_from_dict(f, where) for f in data.get("findings", [])),
        epochs=int(payload.get("epochs", 0)) if part == "run" else 0,
        forward=dict(forward) if isinstance(forward, Mapping) else {},
        node_rank=node if isinstance(node, int) and not isinstance(node, bool) else None,
        host_id=str(payload.get("host_id") or ""),
        cores=cores if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0 else None,
    )


class Job:
    """One rank's part in a distributed job, for one run. Never raises: a failure of the
    exchange is a note, and the run goes on with what this rank knows.

    Each epoch end every rank makes its epoch's summary (small, cheap to make) and sends its
    epochs in batches (the module's docstring, "Batches"); its run's summary and findings, which
    cost a few milliseconds to make (the run's statistics and diagnosis), only every
    ``run_every``-th epoch: a power of two, so that the epochs where every rank sends it are the
    multiples of the largest (``run_due``), where rank 0 can make a job report from summaries
    all taken at the same epoch end."""

    def __init__(
        self,
        info: RankInfo,
        host: str,
        exchange: Exchange | None,
        *,
        min_saving: float = 0.02,
        note: Callable[[str], None] = lambda text: None,
        host_id: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.info = info
        self.host = host
        #: this machine's identity once read (``HostId``)
        self.host_id = host_id
        #: ranks of the job on this machine, once every rank said where it runs
        self._on_host: int | None = None
        self._host_posted = False
        #: the cores this rank's own diagnosis counts on (its machine's, shared among the job's
        #: ranks on it); the session sets it at each epoch end
        self.cores: int | None = None
        #: this rank's load over its run so far (``note_load``): its process tree's busy cores,
        #: the machine's other processes' (its sibling ranks among them) and the machine's cores
        self.load: dict[str, float] = {}
        #: rank 0: each other rank's, as it last said
        self._loads: dict[int, dict[str, float]] = {}
        self.exchange = exchange
        self.min_saving = min_saving
        self._note = note
        #: rank 0: each rank's latest run-level summary (``run`` of its last payload that had one)
        self._latest: dict[int, _Span] = {}
        #: rank 0: each other rank's ``run_every``, as it last said
        self._every: dict[int, int] = {}
        #: rank 0: the epoch end each rank's latest run summary was taken at (None: its run's end)
        self._latest_at: dict[int, int | None] = {}
        #: the job's epochs so far (rank 0)
        self.epochs: list[EpochReport] = []
        #: rank 0: its own epochs whose ranks' summaries are not all in yet (``close_epoch``), each
        #: with its forward passes and group
        self._pending: list[Unsent] = []
        #: a rank other than 0: its epochs not sent yet, the number of its next post and the epoch
        #: at whose end it said it posts next (its first post is at epoch 0's end)
        self._unsent: list[Unsent] = []
        self._posts = 0
        self._next_post = 0
        #: the job's numbers are wanted at each epoch end (a logger's: ``Session.end_epoch``): a
        #: rank other than 0 then posts every epoch, so that rank 0 may wait for it there
        self.each_epoch = False
        #: rank 0: of each other rank, the number of the next post to take, the epoch at whose end
        #: it said it posts next, the latest epoch it sent, and its epochs taken and not yet in a
        #: job epoch (by index: its span and its group)
        self._seq: dict[int, int] = {}
        self._due: dict[int, int] = {}
        self._upto: dict[int, int] = {}
        self._got: dict[int, dict[int, tuple[_Span, tuple[int, int] | None]]] = {}
        #: rank 0: the ranks noted as having ended before one of its epochs, and those whose latest
        #: post it could not read (another version: their word is unknown, so they are not waited
        #: for, nor their epochs, until a post is read)
        self._ended_early: set[int] = set()
        self._unheard: set[int] = set()
        #: this rank's forward passes (``signals/forward.py``) in its latest epoch, as
        #: ``{"epoch": ...}``; the session sets it before each exchange
        self.forward: dict[str, Any] = {}
        #: its forward passes in its run so far, made when a run summary goes out (sorting the
        #: run's samples at every epoch end cost each rank a tenth of a millisecond)
        self.forward_run: Callable[[], Mapping[str, Any] | None] = lambda: None
        #: rank 0: the job's latest epochs (those made at its latest epoch end, at least the
        #: latest) and their rank rows, by index
        self._recent: dict[int, tuple[EpochReport, tuple[RankEntry, ...]]] = {}
        #: this rank's run-level summary goes out every ``run_every``-th epoch (``note_run_cost``)
        self.run_every = 1
        #: seconds spent posting and collecting (for the gather's cost), and how many exchanges
        self.gather_s = 0.0
        #: seconds this rank's latest post with its run summary took (``note_run_cost`` counts it)
        self.run_post_s = 0.0
        self._gathered = 0
        #: how this rank's run ended early (``finish``), and, on rank 0, how the others' did
        self.ending: str | None = None
        self.endings: dict[int, str] = {}
        #: rank 0: each rank's epochs taken after its latest run summary (a rank that dies before
        #: its next run summary still counts them: ``_job_spans``)
        self._since: dict[int, list[_Span]] = {}
        #: rank 0: the job's epochs diagnosed together (``_close_group``): each rank's epochs of the
        #: open group, the findings each rank sent with its latest diagnosis, the open group's
        #: first epoch, and the job's numbers of each recently closed group, by its last epoch
        self._group_spans: dict[int, list[_Span]] = {}
        self._rank_findings: dict[int, tuple[Finding, ...]] = {}
        self._group_first: int | None = None
        self._group_summaries: dict[int, Summary] = {}
        #: rank 0: each other rank's record of its last steps, from its final payload
        self._recent_steps: dict[int, RecentSteps] = {}

    @property
    def leader(self) -> bool:
        return self.info.rank == 0

    def rank_path(self, report_dir: Path) -> Path:
        return report_dir / RANKS_DIR / f"rank-{self.info.rank}.json"

    def run_due(self, index: int) -> bool:
        """Whether epoch ``index``'s end sends (another rank) or can count on (rank 0) the ranks'
        run-level summaries: every rank sends its own at the multiples of its ``run_every``, so
        rank 0 has them all from the same epoch end at the multiples of the largest."""
        every = max(self._every.values(), default=1) if self.leader else self.run_every
        return index % max(1, every) == 0

    def runs_from(self, index: int) -> bool:
        """Rank 0: whether every other rank's latest run summary was taken at epoch ``index``'s
        end, or at the end of its run (after ``settle``; a rank noted late aside): only then does
        the job's report add up summaries of one moment."""
        exchange = self.exchange
        if exchange is None:
            return True
        # a rank noted late, or whose posts cannot be read, is not waited for; one that ended sent
        # its final summary
        others = [r for r in range(1, self.info.world_size) if r not in exchange.late | self._unheard]
        return all(r in self._latest_at and self._latest_at[r] in (index, None) for r in others)

    def note_run_cost(self, cost_s: float, epoch_s: float) -> None:
        """Making and sending this rank's run-level summary take ``cost_s`` (made now, sent as
        the latest one was), after an epoch of ``epoch_s``: send it every ``run_every``-th epoch,
        the smallest power of two that keeps it within ``RUN_SHARE`` of the epochs' time, and at
        most ``MAX_RUN_INTERVAL_S`` apart."""
        if epoch_s <= 0 or cost_s < 0:
            return
        every = 1
        while cost_s > RUN_SHARE * every * epoch_s and 2 * every * epoch_s <= MAX_RUN_INTERVAL_S:
            every *= 2
        self.run_every = every

    def note_epoch(self, epoch_s: float) -> None:
        """An epoch of ``epoch_s`` ended: epochs that grew longer bring ``run_every`` down at once
        (to a divisor of what it was: the epochs rank 0 counts on stay among the new ones), so
        that the run's summary never goes out less often than every ``MAX_RUN_INTERVAL_S``."""
        while self.run_every > 1 and self.run_every * epoch_s > MAX_RUN_INTERVAL_S:
            self.run_every //= 2

    @property
    def post_every(self) -> int:
        """A rank other than 0 posts at the multiples of this (a power of two): those of its
        ``run_every``, where its run summary goes, at most ``MAX_BATCH`` epochs apart; 1 where
        the job's numbers are wanted at each epoch end (``each_epoch``)."""
        return 1 if self.each_epoch else max(1, min(self.run_every, MAX_BATCH))

    def may_wait(self, index: int, waiting: int, epoch_s: float) -> bool:
        """Whether this rank's epoch ``index``, of about ``epoch_s``, may be closed at a later
        epoch end (``Session._wait``), ``waiting`` of its epochs waiting already: not where the
        job's numbers are wanted at each epoch end, nor, on a rank other than 0, where it posts
        (rank 0 counts on the word it gave: ``close_epoch``), nor where the epoch would bring
        ``run_every`` down (``note_epoch``: a run summary made at a later epoch end would be
        of a later moment than the epoch it is sent with). Rank 0's epoch waits where no other
        rank posts (``ranks_post_at``): the ranks' epoch ends that do work fall on the same
        epochs. Rank 0 takes the ranks' posts at whichever of its epoch ends closes the epoch; in
        a job in step they came in long before."""
        if self.each_epoch:
            return False
        if self.leader:
            return not self.ranks_post_at(index)
        if self.run_every > 1 and self.run_every * epoch_s > MAX_RUN_INTERVAL_S:
            return False
        return not self._posts_at(index, len(self._unsent) + waiting + 1)

    def ranks_post_at(self, index: int) -> bool:
        """Rank 0: whether another rank posts at epoch ``index``'s end, as far as its latest post
        taken says: at the epoch it said, or at a multiple of its ``post_every`` (of ``MAX_BATCH``
        before one is taken; a power of two, so the multiples of the smallest are every rank's).
        Rank 0 closes its waiting epochs there too: a rank's pause holds every other rank at the
        next collective, so pauses at different epoch ends add up where pauses at the same one
        overlap (docs/overhead.md, "The ranks pause together")."""
        exchange = self.exchange
        if exchange is None:
            return False
        gone = exchange.done | exchange.late | self._unheard
        heard = [r for r in range(1, self.info.world_size) if r not in gone]
        if not heard:
            return False
        every = min([MAX_BATCH, *(self._every[r] for r in heard if r in self._every)])
        return index % max(1, every) == 0 or any(self._due.get(r) == index for r in heard)

    def _posts_at(self, index: int, kept: int) -> bool:
        """A rank other than 0: whether it posts at epoch ``index``'s end, holding ``kept`` epochs
        not sent yet (that one's included): at the epoch it said, at the multiples of
        ``post_every``, and when its batch is full."""
        return index >= self._next_post or index % self.post_every == 0 or kept >= MAX_BATCH

    def _post(self, report: Report | None, *, final: bool = False) -> None:
        """A rank other than 0: post its epochs not sent yet (with its run's report when given) as
        its next numbered post, saying when it posts next; ``final``: as its final payload."""
        exchange = self.exchange
        batch, self._unsent = self._unsent, []
        if exchange is None:
            return
        start = time.perf_counter()
        name = "final" if final else f"post{self._posts}"
        try:
            self._gathered += 1
            next_post = None
            if not final:
                index = batch[-1][0].index if batch else self._next_post
                every = self.post_every
                next_post = self._next_post = (index // every + 1) * every
                self._posts += 1
            payload = _payload(
                self.info,
                self.host,
                name=name,
                batch=batch,
                report=report,
                run_every=self.run_every,
                next_post=next_post,
                ending=self.ending if final else None,
                forward=self._forward_payload(report is not None),
                host_id=self.host_id(),
                cores=self.cores,
                load=self.load if report is not None else None,
            )
            exchange.post(name, payload)
        except Exception as exc:
            self.exchange = None
            self._note(f"this rank's summaries could not be sent ({type(exc).__name__}: {exc})")
        finally:
            took = time.perf_counter() - start
            self.gather_s += took
            if report is not None:
                self.run_post_s = took

    def _collect(self, names: Mapping[int, str], *, wait: bool, where: str) -> dict[int, dict[str, Any]]:
        """Rank 0: the ranks' payloads at ``names`` (``Exchange.collect``), the ranks that missed
        the deadline noted (``where``: at which point of the run)."""
        exchange = self.exchange
        if exchange is None:
            return {}
        start = time.perf_counter()
        try:
            self._gathered += 1
            before = set(exchange.late)
            got = exchange.collect(names, wait=wait, keep_late=True)
            for r in sorted(exchange.late - before if self.ending is None else ()):
                self._note(
                    f"rank {r} sent no summary within {exchange.timeout_s:g} s at {where} (it may have died "
                    "or be behind); it is not waited for again, and the job's numbers use its latest summary"
                )
            return got
        except Exception as exc:
            self.exchange = None
            self._note(f"the ranks' summaries could not be gathered ({type(exc).__name__}: {exc}); rank 0's only")
            return {}
        finally:
            self.gather_s += time.perf_counter() - start

    def _take_posts(self, until: int | None, *, wait: bool = True, ahead: bool = False) -> None:
        """Rank 0: the ranks' posts, in order. With ``wait``, waits (within the exchange's deadline)
        for each post a rank said it makes at an epoch end up to ``until`` (None: all it sends
        until its final payload, at the end of the run); without, takes what is there. A rank's
        posts beyond rank 0's latest epoch are left for later, unless ``ahead`` (the run's end)."""
        exchange = self.exchange
        if exchange is None:
            return
        where = "the end of the run" if until is None else f"the end of epoch {until}"
        latest = self._pending[-1][0].index if self._pending else None
        horizon = None if ahead else latest
        skip: set[int] = set()
        names: dict[int, str] = {}
        for _ in range(MAX_POSTS_TAKEN):
            names = {
                r: f"post{self._seq.get(r, 0)}"
                for r in range(1, self.info.world_size)
                if r not in exchange.done
                and r not in skip
                and not (wait and (r in self._unheard or (until is not None and self._due.get(r, 0) > until)))
                and not (horizon is not None and self._upto.get(r, -1) >= horizon)
            }
            if not names:
                return
            got = self._collect(names, wait=wait, where=where)
            exchange = self.exchange
            if exchange is None:
                return
            for r in sorted(names):
                if r not in exchange.found:
                    skip.add(r)
                    continue
                if r not in exchange.done:
                    self._seq[r] = self._seq.get(r, 0) + 1
                if r in got:
                    self._receive(r, got[r])
                elif r not in exchange.done:  # a post this version cannot read: its word is unknown
                    self._unheard.add(r)
                    skip.add(r)
                # a rank noted late is back in step once it owes no post (by ``until``, else by
                # rank 0's latest epoch): found, a post of it may still be behind
                limit = until if until is not None else latest
                if r in exchange.late and (limit is None or self._due.get(r, 0) > limit):
                    exchange.late.discard(r)
        if ahead and exchange is not None:  # ranks more than ``MAX_POSTS_TAKEN`` posts ahead: their final
            rest = {r: "final" for r in names if r not in exchange.done}  # payloads all the same
            got = self._collect(rest, wait=False, where=where) if rest else {}
            for r, payload in sorted(got.items()):
                self._receive(r, payload)

    def _receive(self, rank: int, payload: Mapping[str, Any]) -> None:
        """Rank 0: a rank's post or final payload: when it posts next, its run summary and what it
        says of itself (``_take``), and its epochs, kept until they go into the job's epochs."""
        self._unheard.discard(rank)
        next_post = payload.get("next")
        if isinstance(next_post, int) and not isinstance(next_post, bool):
            self._due[rank] = next_post
        failed: list[Exception] = []
        try:
            self._take(payload)
        except Exception as exc:
            failed.append(exc)
        batch = payload.get("batch", [])
        got = self._got.setdefault(rank, {})
        for item in batch if isinstance(batch, list) else ():
            try:
                index = item["index"]
                if not isinstance(index, int) or isinstance(index, bool):
                    raise ValueError(f"an epoch's index is {index!r}")
                self._upto[rank] = max(self._upto.get(rank, -1), index)  # sent, read or not
                span = _span(payload, "epoch", item)
                got[index] = (span, _group_of(item))
                if "run" not in payload:  # its latest run summary does not have it yet
                    self._since.setdefault(rank, []).append(span)
            except Exception as exc:
                failed.append(exc)
        # rank 0's epochs are made in order, each taking its own from ``got``: those before the
        # first still waiting were made without it (a late post); past the bound, epochs beyond
        # rank 0's (the ranks ran different epochs) are never made
        made_to = self._pending[0][0].index if self._pending else self.epochs[-1].index + 1 if self.epochs else 0
        for index in [i for i in got if i < made_to]:
            del got[index]
        while len(got) > MAX_PENDING + MAX_BATCH:
            del got[max(got)]
        if failed:
            error = failed[0]
            self._note(f"rank {rank}'s summary could not be read ({type(error).__name__}: {error})")

    def close_epoch(self, epoch: EpochReport, report: Report | None, *, group: tuple[int, int] | None = None) -> None:
        """This rank's epoch is closed (and, when ``run_due``, its run's report built: ``report``).
        ``group``: the first and last epoch of the group of epochs this one closes (its findings
        are theirs: ``EpochReport``), None when it closes none (it has no findings).
        A rank other than 0 keeps it, and posts its epochs when due (``post_every``, its word,
        its run's report). Rank 0 takes the posts the ranks said they made at its previous epoch
        end at the latest (in a job in step they arrived long ago) and makes the job's epochs whose
        ranks' summaries are all in, unless something needs the job's numbers sooner
        (``job_epoch``, ``settle``): waiting for the ranks at every epoch end would add their
        epoch end's work to rank 0's."""
        if not self.leader:
            self._unsent.append((epoch, dict(self.forward.get("epoch") or {}), group))
            if report is not None or self._posts_at(epoch.index, len(self._unsent)):
                self._post(report)
            return
        self._pending.append((epoch, dict(self.forward.get("epoch") or {}), group))
        self._take_posts(epoch.index - MAX_DEFERRED)
        self._join()
        while len(self._pending) > MAX_PENDING:
            self._make_next()

    def _join(self, *, force: bool = False) -> None:
        """Rank 0: the job's epochs whose ranks' summaries are in (or from ranks that send no
        more: ended, or late), in order; ``force``: every epoch waiting, with what is in."""
        exchange = self.exchange
        gone = set(range(self.info.world_size)) if exchange is None else exchange.done | exchange.late | self._unheard
        others = [r for r in range(1, self.info.world_size) if r not in gone]
        while self._pending:
            index = self._pending[0][0].index
            if not force and any(self._upto.get(r, -1) < index for r in others):
                break
            self._make_next()

    def _make_next(self) -> None:
        """Rank 0: the job's next epoch, with what is in; kept among the latest ones for a panel
        printed after (``job_epoch``)."""
        self._recent.update(self._gather(*self._pending.pop(0)))
        _keep_latest(self._recent, MAX_PENDING)

    def note_load(self, host: HostSummary | None) -> None:
        """This rank's run so far, as the host sampler saw it (None: not sampled)."""
        if host is None or host.others_cores is None or not host.machine_cores:
            return
        self.load = {
            "own": round(host.main_cores + host.workers_cores, 3),
            "others": round(host.others_cores, 3),
            "machine": float(host.machine_cores),
            "wall_s": round(host.wall_s, 3),
        }

    def load_notes(self, notes: Sequence[str], ranks: Sequence[RankEntry]) -> tuple[str, ...]:
        """Rank 0: the job's notes with the ranks' notes on other processes' load made one per
        machine, and, on rank 0's machine, the job's own ranks (and their workers) counted as the
        job's: each rank's sampler counted its sibling ranks among the "other processes"."""
        notes = load_notes_once(notes, ranks)
        own = self.load
        mine = {e.rank for e in ranks if e.host_id and e.host_id == (self.host_id() or "")} | {0}
        loads = [own, *(self._loads[r] for r in sorted(mine - {0}) if r in self._loads)]
        if not own or len(loads) < 2 or len(loads) < len(mine):
            return notes
        machine = own["machine"]
        job_cores = sum(load["own"] for load in loads)
        others = max(0.0, own["others"] - sum(load["own"] for load in loads[1:]))
        kept = [text for text in notes if not (text.startswith(LOAD_NOTE) or _RANK_LOAD_NOTE.match(text))]
        if own["wall_s"] >= MIN_SAMPLED_S and others >= OTHERS_SHARE * machine:
            kept.append(
                f"{LOAD_NOTE}{others:.1f} of rank 0's machine's {count(round(machine), 'core')} busy during the run, "
                "the job's own ranks and their workers aside: the timings are disturbed"
            )
        if job_cores > machine:
            kept.append(
                f"the job's {len(loads)} ranks on rank 0's machine and their workers kept {job_cores:.1f} of its "
                f"{count(round(machine), 'core')} busy on average: they oversubscribe it (each rank's diagnosis "
                f"counts on {count(self.cores or 1, 'core')})"
            )
        return tuple(kept)

    def ranks_on_host(self) -> int | None:
        """Ranks of the job on this machine, whatever their node rank (two "nodes" may share one
        machine): each rank posts its ``HostId`` once, and this counts the ranks that posted the
        same, once all have (one look per call until then); None until then, or for a job too
        large to look up."""
        if self._on_host is not None:
            return self._on_host
        exchange, mine = self.exchange, self.host_id()
        if exchange is None or mine is None or self.info.world_size > MAX_HOST_LOOKUP_RANKS:
            return None
        try:
            if not self._host_posted:
                exchange.store.set(exchange.key(self.info.rank, "host"), mine.encode())
                self._host_posted = True
            keys = [exchange.key(r, "host") for r in range(self.info.world_size)]
            if not exchange.store.check(keys):
                return None
            hosts = [bytes(exchange.store.get(key)).decode(errors="replace") for key in keys]
        except Exception:
            return None
        self._on_host = max(1, sum(host == mine for host in hosts))
        return self._on_host

    def stop_waiting(self, ending: str) -> None:
        """This rank's run ends early (``ending``: an exception, a SIGTERM): from now on rank 0
        takes what the ranks sent and waits for none of them (they may be blocked in a collective
        waiting for it); the first reason given is the one said."""
        if self.ending is None:
            self.ending = ending
        if self.exchange is not None:
            self.exchange.timeout_s = 0.0  # one look at what is there, no wait

    def settle(self) -> None:
        """Rank 0: take the ranks' posts they said they made by its latest epoch end (waiting for
        them, within the exchange's deadline) and any other they made already (one look), and make
        the job's epochs they complete. Epochs a rank sends later stay waiting for it."""
        if not self._pending:
            return
        self._take_posts(self._pending[-1][0].index)
        self._take_posts(None, wait=False)
        self._join()

    def made(self, index: int) -> bool:
        """Rank 0: whether the job's epoch ``index`` is made (its ranks' summaries in)."""
        return not any(epoch.index <= index for epoch, _, _ in self._pending)

    def job_epoch(self, index: int) -> tuple[EpochReport, tuple[RankEntry, ...]] | None:
        """Rank 0: the job's epoch ``index`` and its rank rows (the ranks' summaries taken first
        when they are still waiting, as ``settle``: an epoch a rank sends later has rank 0's
        numbers alone); None when it is no longer at hand."""
        if not self.made(index):
            self.settle()
        if index in self._recent:
            return self._recent[index]
        made = next((epoch for epoch, _, _ in self._pending if epoch.index == index), None)
        made = made or next((epoch for epoch in reversed(self.epochs) if epoch.index == index), None)
        return (made, ()) if made is not None else None

    def group_summary(self, index: int) -> Summary | None:
        """Rank 0: the job's numbers of the group of epochs that epoch ``index`` closed, when it
        closed one of several epochs and is recent (its panel's)."""
        return self._group_summaries.get(index)

    def _gather(
        self, epoch: EpochReport, forward: Mapping[str, Any], group: tuple[int, int] | None = None
    ) -> dict[int, tuple[EpochReport, tuple[RankEntry, ...]]]:
        """Rank 0: the job's epoch from its own and the ranks' summaries of epoch ``epoch.index``
        taken so far (``forward``: rank 0's forward passes in it; ``group``: the epochs rank 0
        diagnosed together that it closes, None when it closes none). Returns it with its rows."""
        exchange = self.exchange
        spans = [
            _Span(
                0,
                self.host,
                epoch.summary,
                epoch.findings,
                forward=forward,
                node_rank=self.info.node_rank,
                host_id=self.host_id() or "",
                cores=self.cores,
            )
        ]
        groups = [group]
        for r in range(1, self.info.world_size):
            got = self._got.get(r)
            taken = got.pop(epoch.index, None) if got else None
            if taken is not None:
                spans.append(taken[0])
                groups.append(taken[1])
            elif exchange is not None and r in exchange.done and r not in self._ended_early:
                self._ended_early.add(r)
                self._note(f"rank {r} ended its run before epoch {epoch.index}: the ranks ran different epochs")
        job_epoch = EpochReport(index=epoch.index, summary=job_summary([s.summary for s in spans]), findings=())
        rows = tuple(s.entry() for s in spans)
        for span, payload_group in zip(spans, groups, strict=True):
            self._group_spans.setdefault(span.rank, []).append(span)
            if len(self._group_spans[span.rank]) > MAX_GROUP_SPANS:  # added up, to stay bounded
                parts = self._group_spans[span.rank]
                self._group_spans[span.rank] = [_extended(parts[0], parts[1:])]
            if payload_group is not None:  # the rank's latest diagnosis
                self._rank_findings[span.rank] = span.findings
        if self._group_first is None:
            self._group_first = epoch.index
        self.epochs.append(job_epoch)
        if len(self.epochs) > MAX_JOB_EPOCHS:
            del self.epochs[10]
        if group is not None:
            job_epoch, rows = self._close_group(job_epoch, rows)
        self._note_missing()
        return {epoch.index: (job_epoch, rows)}

    def _close_group(
        self, job_epoch: EpochReport, rows: tuple[RankEntry, ...]
    ) -> tuple[EpochReport, tuple[RankEntry, ...]]:
        """Rank 0: the job's epochs since the last diagnosis are diagnosed together at
        ``job_epoch``, the last of them (the last one in ``self.epochs``): each rank's epochs of
        the group added up, with the findings of its latest diagnosis (each rank groups its own
        epochs, by the same rule: in a job in step, at the same epochs). The other epochs of the
        group get ``diagnosed_with``. Returns the closing epoch and the group's rank rows."""
        first = self._group_first if self._group_first is not None else job_epoch.index
        last = job_epoch.index
        spans = []
        for rank in sorted(self._group_spans):
            parts = self._group_spans[rank]
            span = _extended(parts[0], parts[1:]) if len(parts) > 1 else parts[0]
            spans.append(replace(span, findings=self._rank_findings.get(rank, ()), epochs=len(parts)))
        self._group_spans = {}
        self._group_first = None
        covers = (first, last) if first < last else None
        closing = replace(job_epoch, findings=_diagnose(spans, self.min_saving), covers_epochs=covers)
        self.epochs[-1] = closing
        if covers is not None:
            for i in range(len(self.epochs) - 2, -1, -1):
                e = self.epochs[i]
                if e.index < first:
                    break
                self.epochs[i] = replace(e, diagnosed_with=last)
            # kept for the panels still held (several groups can close in one batch of epochs)
            self._group_summaries[last] = job_summary([s.summary for s in spans])
            _keep_latest(self._group_summaries, MAX_PENDING)
            rows = tuple(s.entry() for s in spans)
        return closing, rows

    def close_open_group(self) -> None:
        """Rank 0, at the run's end: the job's epochs not diagnosed yet are diagnosed together
        all the same (as each rank's own are), held by the last of them."""
        if self._group_first is None or not self.epochs or not self._group_spans:
            return
        self._close_group(self.epochs[-1], ())

    def finish(self, report: Report, *, ending: str | None = None) -> tuple[Report, tuple[RankEntry, ...]]:
        """The run is over: post the final summary (ranks other than 0) or collect the others'
        final ones and build the job's report (rank 0). ``ending``: how this rank's run ended
        early (an exception): rank 0 then waits for no one (the others may be blocked in a
        collective waiting for it), takes what the ranks sent so far and says so."""
        if ending is not None:
            self.stop_waiting(ending)
        if self.leader and self.ending is not None:
            self._note(
                "rank 0's run ended early: the other ranks' final summaries were not waited for; their rows are "
                "what they had sent"
            )
        if not self.leader:
            self._post(report, final=True)
            return report, ()
        # every rank's posts and final payload (the epochs it had not sent), or what is there when
        # rank 0's run ended early, then what came meanwhile from a rank not waited for (late, or
        # unread); the job's epochs waiting, made with what came
        self._take_posts(None, wait=self.ending is None, ahead=True)
        self._take_posts(None, wait=False, ahead=True)
        self._join(force=True)
        self.close_open_group()
        self._note_missing()
        spans = _job_spans(report, self._own_span_of, self._latest, self._since)
        if len({s.epochs for s in spans}) > 1:
            counts = ", ".join(f"rank {s.rank} {s.epochs}" for s in spans)
            self._note(f"the ranks closed different numbers of epochs ({counts})")
        works = [s.work() for s in spans]
        for text in (uneven_steps(works), unseen_wait_note(works)):
            if text is not None:
                self._note(text)
        job = job_report(report, spans, tuple(self.epochs), min_saving=self.min_saving)
        others = tuple(r for _, r in sorted(self._recent_steps.items()) if r.rank != 0)
        if others:
            job = replace(job, recent=(*job.recent, *others))
        return job, job.ranks

    def report_later(self) -> Callable[[Report], Report]:
        """Rank 0: the job's report given rank 0's own, as of now: the other ranks' latest
        run-level summaries and the job's epochs are taken now; the report is made (on any
        thread) when called."""
        latest, own_span = dict(self._latest), self._own_span_of
        since = {r: list(spans) for r, spans in self._since.items()}
        epochs = tuple(self.epochs)
        min_saving = self.min_saving

        def make(own: Report) -> Report:
            return job_report(own, _job_spans(own, own_span, latest, since), epochs, min_saving=min_saving)

        return make

    def _forward_payload(self, run: bool) -> dict[str, Any]:
        """This rank's forward passes in the run, for a payload with its run summary (rank 0 reads
        them only there; each epoch's go with the epoch)."""
        made = self.forward_run() if run else None
        return {"run": dict(made)} if made else {}

    @property
    def _own_span_of(self) -> Callable[[Report], _Span]:
        """Rank 0's run as a span, given its report (its forward passes and node as of now)."""
        host, forward, node = self.host, dict(self.forward_run() or {}), self.info.node_rank
        host_id, cores = self.host_id() or "", self.cores

        def own_span(own: Report) -> _Span:
            return _Span(
                0,
                host,
                own.summary,
                own.findings,
                len(own.epochs),
                forward=forward,
                node_rank=node,
                host_id=host_id,
                cores=cores,
            )

        return own_span

    def _take(self, payload: Mapping[str, Any]) -> None:
        """A rank's payload: what it says of itself, and its run-level summary when it has one."""
        rank = int(payload["rank"])
        every = payload.get("every")
        if isinstance(every, int) and every >= 1:
            self._every[rank] = every
        load = payload.get("load")
        if isinstance(load, Mapping) and all(
            isinstance(load.get(k), (int, float)) for k in ("own", "others", "machine", "wall_s")
        ):
            self._loads[rank] = {k: float(load[k]) for k in ("own", "others", "machine", "wall_s")}
        ending = payload.get("ending")
        if isinstance(ending, str) and ending:
            self.endings[rank] = ending
        if "recent" in payload:
            self._recent_steps[rank] = recent_from_dict(payload["recent"], f"rank {rank}'s recent steps")
        if "run" not in payload:
            return
        span = _span(payload, "run")
        self._latest[span.rank] = span
        self._since.pop(span.rank, None)
        at = payload.get("run_at")
        self._latest_at[span.rank] = at if isinstance(at, int) else None
        for text in payload.get("notes", []):
            if isinstance(text, str):
                self._note(f"rank {span.rank}: {text}")

    def _note_missing(self) -> None:
        if self.exchange is None and self._gathered == 0:
            self._note(
                f"a job of {self.info.world_size} ranks, but only rank 0's numbers are in this report: "
                "the other ranks' summaries were not gathered (torch.distributed is not initialised); "
                f"each rank writes its own under {RANKS_DIR}/"
            )
            return
        missing = [r for r in range(1, self.info.world_size) if r not in self._latest]
        if missing:
            self._note(f"no summary from rank(s) {', '.join(map(str, missing))}: the job's numbers leave them out")


def _keep_latest(by_epoch: dict[int, Any], most: int) -> None:
    """``by_epoch`` (keyed by epoch index) down to its ``most`` latest entries."""
    for index in sorted(by_epoch)[: max(0, len(by_epoch) - most)]:
        del by_epoch[index]


def _group_of(item: Mapping[str, Any]) -> tuple[int, int] | None:
    """The group of epochs a rank's epoch closes, as it said (None: none)."""
    group = item.get("group")
    if isinstance(group, list) and len(group) == 2 and all(isinstance(g, int) for g in group):
        return (group[0], group[1])
    return None


def _diagnose(spans: list[_Span], min_saving: float) -> tuple[Finding, ...]:
    """The job's findings from the ranks' spans (``analysis/job.py``)."""
    return tuple(diagnose_job([s.work() for s in spans], min_saving=min_saving))


def _job_spans(
    own: Report,
    own_span: Callable[[Report], _Span],
    latest: Mapping[int, _Span],
    since: Mapping[int, Sequence[_Span]] | None = None,
) -> list[_Span]:
    """Rank 0's own run and the other ranks' latest run summaries, in rank order; each with the
    epochs rank 0 took from that rank after it (``since``: a rank that died between two run
    summaries still has the epochs it closed counted)."""
    since = since or {}
    return [own_span(own), *(_extended(latest[r], since.get(r, ())) for r in sorted(latest) if r != 0)]


def _extended(span: _Span, epochs: Sequence[_Span]) -> _Span:
    """A rank's run summary with the epochs it closed after it added: steps, wall time, seconds
    per phase and idle time (the step-time statistics stay the run summary's)."""
    if not epochs:
        return span
    summary = consecutive_summary([span.summary, *(e.summary for e in epochs)])
    return replace(span, summary=summary, epochs=span.epochs + len(epochs))


def job_report(own: Report, spans: list[_Span], epochs: tuple[EpochReport, ...], *, min_saving: float) -> Report:
    """Rank 0's report for the job: its own run information and notes, the ranks' summaries
    together, the job's epochs and findings, a row per rank."""
    ranks = tuple(s.entry() for s in spans)
    return replace(
        own,
        summary=job_summary([s.summary for s in spans]),
        epochs=epochs,
        findings=_diagnose(spans, min_saving),
        ranks=ranks,
    )


#: how a note on other processes' load begins (``analysis/disturbance.py``), and a rank's of it
LOAD_NOTE = "other processes kept "
_RANK_LOAD_NOTE = re.compile(r"rank (\d+): " + re.escape(LOAD_NOTE))


def load_notes_once(notes: Sequence[str], ranks: Sequence[RankEntry]) -> tuple[str, ...]:
    """``notes`` with the notes on other processes' load kept once per machine: ranks of one
    machine see the same load (each other's too), and the run panel said it once per rank. Rank
    0's own note (unprefixed) stands for its machine, else the first rank's that has one."""
    machine = {e.rank: e.host_id or e.host for e in ranks}
    seen: set[str] = set()
    out: list[str] = []
    for text in notes:
        found = _RANK_LOAD_NOTE.match(text)
        rank = int(found.group(1)) if found else 0 if text.startswith(LOAD_NOTE) else None
        if rank is not None and rank in machine:
            if machine[rank] in seen:
                continue
            seen.add(machine[rank])
        out.append(text)
    return tuple(out)


def join_job(host: str, *, min_saving: float, note: Callable[[str], None], host_id: HostId | None = None) -> Job | None:
    """This process's part in a distributed job, or None when it runs alone."""
    global _runs_joined
    info = rank_info()
    if info is None:
        return None
    exchange: Exchange | None = None
    try:
        store = default_store()
    except Exception as exc:
        store = None
        note(f"the ranks' summaries cannot be gathered ({exc})")
    if store is not None:
        _runs_joined += 1
        exchange = Exchange(store, prefix=f"{KEY_PREFIX}/run{_runs_joined}", rank=info.rank, world_size=info.world_size)
    machine = host_id if host_id is not None else HostId(host)
    return Job(info, host, exchange, min_saving=min_saving, note=note, host_id=lambda: machine.value)


#: seconds a rank's SIGTERM handler gives the report of what ran before the process dies
TERM_WRITE_S = 5.0


class TermGuard:
    """A rank's SIGTERM: the report of what ran is written (``complete: false``), then the process
    dies of the signal as it would have without StallScope.

    A launcher ends the job's other ranks with SIGTERM when one rank fails (``torchrun`` sends it
    within about a second, and SIGKILL 30 s later). With the default disposition a rank dies at
    once and its report is lost. So a rank whose SIGTERM has the default disposition (a handler of
    the user's is left alone) gets this one, on the main thread only:

    * outside the run's end (``finishing`` false) it hands ``write`` (made on the main thread
      from the interrupted frame, as what only the training thread may read is read there, and
      the epochs still waiting are closed there where the frame is the user's code) to a new
      thread and waits for it at most ``TERM_WRITE_S``: a lock the interrupted code holds delays
      the write, never the death; then the default disposition is back and the signal sent
      again, so the process ends exactly as bare (killed by SIGTERM);
    * during the run's end (``finish`` in progress) it only says so (``pending``): the end waits
      for no other rank from then on (``stop_waiting``), writes, and calls ``reraise``.
    """

    def __init__(
        self, write: Callable[[types.FrameType | None], Callable[[], None]], stop_waiting: Callable[[], None]
    ) -> None:
        self._write = write
        self._stop_waiting = stop_waiting
        self.finishing = False
        self.pending = False
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        except (ValueError, OSError):
            return

    def uninstall(self) -> None:
        """The default disposition back, when this guard's handler is still the one in place."""
        if not self._installed:
            return
        self._installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    def reraise(self) -> None:
        """Die of SIGTERM as bare (after the run's end wrote its report), if one came."""
        if not self.pending:
            return
        self.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.pending = True
        if self.finishing:
            self._stop_waiting()
            return
        self.uninstall()  # a second SIGTERM kills at once
        try:
            finish = self._write(frame)
            thread = threading.Thread(target=finish, name="stallscope-term", daemon=True)
            thread.start()
            thread.join(TERM_WRITE_S)
        except Exception:
            pass
        finally:
            self.reraise()
