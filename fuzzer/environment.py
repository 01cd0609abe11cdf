"""The build fingerprint of the running environment (versions, device, driver)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess

from fuzzer.results import BuildFingerprint

_PACKAGES = {
    "flash_attn_4": "flash-attn-4",
    "flash_attn": "flash-attn",
    "transformer_engine": "transformer-engine",
    "nvidia_cutlass_dsl": "nvidia-cutlass-dsl",
    "triton": "triton",
}
_TE_ALTERNATES = ("transformer_engine", "transformer-engine-cu13", "transformer-engine-cu12", "transformer_engine_torch")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def current_fingerprint(device: str = "cpu") -> BuildFingerprint:
    """Versions of torch, CUDA, cuDNN, flash-attn-4, flash-attn, TE, cutlass-dsl, triton, Python,
    and the device's name, compute capability and driver. Absent packages give ``""``.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (the worker's device; the current CUDA device is used).
    """
    import torch

    versions = {field: _version(dist) for field, dist in _PACKAGES.items()}
    if not versions["transformer_engine"]:
        versions["transformer_engine"] = next((v for v in map(_version, _TE_ALTERNATES) if v), "")
    cuda = torch.version.cuda or ""
    cudnn = ""
    if torch.backends.cudnn.is_available():
        cudnn = str(torch.backends.cudnn.version() or "")
    device_name, capability, driver = platform.processor() or platform.machine(), "", ""
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        device_name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        capability = f"{major}.{minor}"
        try:
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.splitlines()[0].strip()
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = ""
    return BuildFingerprint(
        torch=torch.__version__,
        cuda=cuda,
        cudnn=cudnn,
        python=platform.python_version(),
        device_name=device_name or "cpu",
        compute_capability=capability,
        driver=driver,
        **versions,
    )
