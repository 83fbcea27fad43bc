"""Build and script the stand-in ``libnvidia-ml.so.1`` (``stubnvml.c``) for tests without a GPU.

``build(dest, omit=...)`` compiles it with gcc (``omit`` leaves NVML functions out, so pynvml
raises ``FunctionNotFound``); ``write_script(path, **settings)`` writes the script it reads from
``$STUBNVML_SCRIPT`` (see the C file's header for the keys; ``fail={"nvmlDeviceGetPowerUsage": 3}``
makes a function return an error code, ``fail_after`` makes it fail after some calls, and
``block_after`` makes it hang, as a wedged driver does).

``load_in_process(lib)`` loads a built library into this process so that pynvml's own
``CDLL("libnvidia-ml.so.1")`` finds it (same soname), for tests that drive the sampler
synchronously with fake clocks; ``stubnvml_set_time_us`` then drives the stub's clock too.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

SOURCE = Path(__file__).with_name("stubnvml.c")
LIB_NAME = "libnvidia-ml.so.1"


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def build(dest: Path, omit: Iterable[str] = ()) -> Path:
    """Compile the stub into ``dest/libnvidia-ml.so.1`` and return that path."""
    compiler = gcc()
    if compiler is None:
        raise RuntimeError("no C compiler")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / LIB_NAME
    cmd = [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{LIB_NAME}", "-o", str(out), str(SOURCE), "-lpthread"]
    cmd[1:1] = [f"-DOMIT_{name}" for name in omit]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def write_script(
    path: Path,
    fail: Mapping[str, int] | None = None,
    *,
    fail_after: Mapping[str, tuple[int, int]] | None = None,
    block_after: Mapping[str, int] | None = None,
    **settings: object,
) -> Path:
    """Write a stub script: one ``key value`` line per setting, plus ``fail <function> <code>``,
    ``fail_after <function> <n> <code>`` (``fail_after={fn: (n, code)}``) and
    ``block_after <function> <n>`` (``block_after={fn: n}``: later calls never return)."""
    lines = [f"{key} {value}" for key, value in settings.items()]
    lines += [f"fail {name} {code}" for name, code in (fail or {}).items()]
    lines += [f"fail_after {name} {n} {code}" for name, (n, code) in (fail_after or {}).items()]
    lines += [f"block_after {name} {n}" for name, n in (block_after or {}).items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def load_in_process(lib: Path) -> ctypes.CDLL:
    """Load the stub here so that ``CDLL("libnvidia-ml.so.1")`` (pynvml) resolves to it."""
    handle = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    if ctypes.CDLL(LIB_NAME)._handle != handle._handle:
        raise RuntimeError("another libnvidia-ml.so.1 is already loaded in this process")
    handle.stubnvml_set_time_us.argtypes = [ctypes.c_ulonglong]
    handle.stubnvml_set_busy.argtypes = [ctypes.c_int]
    return handle
