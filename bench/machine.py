"""The machine and versions every benchmark report states in its header."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

from tensat.measure import cpu_name as cpu_model

PACKAGES = ("tensat", "egglog", "onnx", "onnxruntime-gpu", "onnxruntime", "pulp", "highspy", "numpy")


def gpu_models() -> list[str]:
    """The names of the NVIDIA GPUs `nvidia-smi` lists (none where it is missing or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine_info() -> dict[str, Any]:
    """CPU model, core count, memory, GPUs, Python and the versions of the libraries tensat runs on."""
    from tensat.extraction.ilp import quiet_highs  # the HiGHS version, without its banner on stdout

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
        "gpus": gpu_models(),
        "python": platform.python_version(),
        "versions": versions,
        "highs": quiet_highs().version(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def header(info: dict[str, Any]) -> str:
    """One markdown paragraph naming the machine and versions."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    gpus = ", ".join(info.get("gpus") or []) or "no GPU"
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, {gpus} (shared, noisy). "
        f"Python {info['python']}; {versions}; HiGHS {info['highs']}. Run {info['date']}."
    )
