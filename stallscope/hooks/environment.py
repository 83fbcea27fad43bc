"""Facts about the run gathered once: device, torch version, host. Never initialises CUDA."""

from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone
from typing import Any

from stallscope.report.schema import DeviceInfo


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) if torch is not None else ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def current_device() -> DeviceInfo:
    """The accelerator torch is using. CUDA counts only once the user's code initialised it, so
    StallScope never creates a CUDA context (or breaks forked workers) on its own."""
    torch: Any = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
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
    return DeviceInfo(kind="cpu", name=_cpu_name(), index=None)
