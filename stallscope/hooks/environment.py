"""Facts about the run gathered once: device, torch version, host. Never initialises CUDA."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

from stallscope.report.schema import DeviceInfo
from stallscope.signals.cuda_events import cuda_in_use
from stallscope.signals.host import cpu_name


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def torch_version() -> str:
    """The torch in use, or installed (without importing it when the user's code did not)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", ""))
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return ""


def current_device(*, cuda: bool | None = None) -> DeviceInfo:
    """The accelerator torch is using. CUDA counts only once the user's code initialised it and
    keeps tensors on it (``cuda_in_use``), so StallScope never creates a CUDA context (or breaks
    forked workers) on its own, and a CPU run in a process that touched CUDA stays a CPU run.
    ``cuda=False``: the caller knows the run does no work on CUDA (the CPU then)."""
    torch: Any = sys.modules.get("torch")
    try:
        if torch is not None and cuda is not False and cuda_in_use(torch):
            index = int(torch.cuda.current_device())
            props = torch.cuda.get_device_properties(index)
            uuid = getattr(props, "uuid", None)
            uuid_text = None
            if uuid is not None:
                uuid_text = str(uuid)
                if not uuid_text.startswith(("GPU-", "MIG-")):
                    uuid_text = f"GPU-{uuid_text}"
            return DeviceInfo(kind="cuda", name=str(props.name), index=index, uuid=uuid_text)
    except Exception:  # a broken CUDA install is a note, not a crash
        pass
    return DeviceInfo(kind="cpu", name=cpu_name(), index=None)


def compute_threads(*, on_cuda: bool | None = None) -> int:
    """Host threads the compute competes with loader workers for: torch's intra-op threads when
    the accelerator is the CPU itself, 1 when CUDA does the compute (``on_cuda``: what the caller
    saw; None: whether CUDA is in use now)."""
    torch: Any = sys.modules.get("torch")
    if torch is None or on_cuda:
        return 1
    try:
        if on_cuda is None and cuda_in_use(torch):
            return 1
        return max(1, int(torch.get_num_threads()))
    except Exception:
        return 1


def count_tensors(batch: object, limit: int = 64) -> int | None:
    """Tensors in a batch (nested tuples, lists and dicts); None when it holds none."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    count = 0
    stack = [batch]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            count += 1
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return count or None


def batch_bytes(batch: object, limit: int = 64) -> int | None:
    """Bytes of the tensors in a batch (nested tuples, lists and dicts); None when it holds none.
    Read once per pass: what handing the batch over from a worker process moves."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    total = 0
    found = False
    stack = [batch]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
            found = True
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return total if found else None
