"""The device costs are measured on: resolving "auto", probing CUDA, naming the CPU or GPU, and the fingerprint
that keys the cost cache (device name, provider, onnxruntime version, threads, clock and method)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tensat.errors import TensatError
from tensat.measure.units import _tiny_model
from tensat.session import make_session, onnxruntime_module

METHOD = "blocked-evict-v20"
DEVICES = ("auto", "cpu", "cuda")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Silence onnxruntime's logger and the process's stderr file descriptor (CUDA loaders print there)."""
    ort = onnxruntime_module()
    ort.set_default_logger_severity(4)
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        saved = -1
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        if saved >= 0:
            os.dup2(devnull, 2)
        yield
    finally:
        if saved >= 0:
            os.dup2(saved, 2)
            os.close(saved)
        os.close(devnull)
        ort.set_default_logger_severity(3)


_CUDA_OK: bool | None = None


def cuda_available() -> bool:
    """True when onnxruntime's CUDA provider is present and a session on it actually runs (checked once, quietly)."""
    global _CUDA_OK
    if _CUDA_OK is not None:
        return _CUDA_OK
    ok = False
    try:
        with _silenced():
            ort = onnxruntime_module()
            if PROVIDERS["cuda"] in ort.get_available_providers():
                sess = make_session(_tiny_model().SerializeToString(), [PROVIDERS["cuda"]], log_severity=4)
                if sess.get_providers()[:1] == [PROVIDERS["cuda"]]:
                    out = sess.run(None, {"x": np.ones((1, 1), np.float32)})[0]
                    ok = bool(out.shape == (1, 1))
    except Exception:  # noqa: BLE001 - any failure means "no usable CUDA"
        ok = False
    _CUDA_OK = ok
    return ok


def resolve_device(device: str = "auto") -> str:
    """ "cpu" or "cuda" for a requested device ("auto" = CUDA where it loads, else CPU)."""
    if device not in DEVICES:
        raise TensatError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise TensatError(
            "device cuda requested, but onnxruntime's CUDA execution provider does not run on this "
            "machine; use --device cpu or auto"
        )
    return device


def cpu_name() -> str:
    """The CPU model name (from /proc/cpuinfo where there is one): part of the cost cache's fingerprint, and the
    machine named by comparison and benchmark reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_name() -> str:
    """The first CUDA GPU's name (via nvidia-smi; a generic name where that is missing)."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run(
                [exe, "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            name = out.stdout.strip().splitlines()[0].strip() if out.stdout.strip() else ""
            if name:
                return name
        except (OSError, subprocess.SubprocessError):
            pass
    return "CUDA device 0"


def default_clock(device: str, threads: int) -> str:
    """ "cpu" (thread CPU time) for single-threaded CPU sessions, else "wall"."""
    return "cpu" if device == "cpu" and int(threads) == 1 else "wall"


def device_info(device: str, threads: int, clock: str | None = None) -> dict[str, Any]:
    """What identifies measurements: device name, provider, onnxruntime version, threads, clock and method."""
    ort = onnxruntime_module()
    return {
        "device": gpu_name() if device == "cuda" else cpu_name(),
        "provider": PROVIDERS[device],
        "onnxruntime": ort.__version__,
        "threads": int(threads),
        "optimization": "all",
        "clock": clock or default_clock(device, threads),
        "method": METHOD,
    }


def fingerprint(info: Mapping[str, Any]) -> str:
    """A short stable hash of `device_info`."""
    return hashlib.sha256(json.dumps(dict(info), sort_keys=True).encode()).hexdigest()[:24]
