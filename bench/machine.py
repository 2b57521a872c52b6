"""The machine and versions every benchmark report states in its header."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from importlib import metadata
from typing import Any

PACKAGES = ("tensat", "egglog", "onnx", "onnxruntime-gpu", "onnxruntime", "pulp", "highspy", "numpy")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """CPU model, core count, memory, Python and the versions of the libraries tensat runs on."""
    import highspy

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory_gib = None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "versions": versions,
        "highs": highspy.Highs().version(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def header(info: dict[str, Any]) -> str:
    """One markdown paragraph naming the machine and versions."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB (shared, noisy). "
            f"Python {info['python']}; {versions}; HiGHS {info['highs']}. Run {info['date']}.")
