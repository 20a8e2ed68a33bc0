"""What NVML's answers mean, read without importing pynvml (seams.gpu does, and hands its errors here).

Which errors mean the GPU or driver is gone (the probe stops), which answers will not change while the
driver stays loaded (the field is not asked again), what a failed start tells the user, and how a field
value, an error code and a driver string are decoded.
"""

from __future__ import annotations

from typing import Any

# NVML errors after which the device or library is unusable: stop sampling instead of answering None.
FATAL = frozenset({"GpuIsLost", "Uninitialized", "DriverNotLoaded", "LibraryNotFound", "LibRmVersionMismatch",
                   "ResetRequired"})
# Answers that will not change while the driver stays loaded: the field is not asked for again.
PERMANENT = frozenset({"NotSupported", "FunctionNotFound", "LibraryMismatch"})
UNAVAILABLE_HINTS = {
    "LibraryNotFound": ("no NVIDIA driver: libnvidia-ml.so.1 was not found",
                        "install the NVIDIA driver (or run inside a container started with --gpus all)"),
    "DriverNotLoaded": ("the NVIDIA driver is not loaded", "check `nvidia-smi`; a reboot after a driver update may be due"),
    "NoPermission": ("no permission to use the NVIDIA driver", "check the permissions of /dev/nvidia*"),
    "LibRmVersionMismatch": ("the NVIDIA library and kernel driver versions differ",
                             "reboot after the driver update, or reload the nvidia kernel modules"),
}
FIELD_NAMES = {186: "power.instant", 82: "temp_mem"}  # NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_MEMORY_TEMP
# c_nvmlValue_t member by NVML_VALUE_TYPE_*: double, uint, ulong, ulonglong, slonglong, sint, ushort
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class Never(Exception):
    """Stands in for an exception class a pynvml version does not define."""


def error_name(exc: BaseException) -> str:
    name = type(exc).__name__
    return name[len("NVMLError_"):] if name.startswith("NVMLError_") else f"code {getattr(exc, 'value', '?')}"


def code_name(nv: Any, code: int) -> str:
    try:
        name = str(nv.nvmlExceptionClass(code).__name__)
    except (ValueError, AttributeError):
        return f"code {code}"
    return name.removeprefix("NVMLError_")


def field_value(v: Any) -> float | int | None:
    try:
        value = getattr(v.value, _VALUE_MEMBERS[int(v.valueType)])
    except (IndexError, AttributeError, ValueError):
        return None
    return value if isinstance(value, (int, float)) else None


def scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def as_int(value: Any) -> int | None:
    return None if value is None else int(value)


def as_text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
