"""`<config>/bench.yaml`: whether this node takes benchmark units from peers, and its floors.

    enabled: true            # take benchmark units from peers granted `bench` (default: false)
    hardware_class: gb10     # what this node benchmarks as; omitted: detected from its GPU
    floors:
      memory_gb: 16          # refuse units while less memory is available
      disk_gb: 50            # refuse units while less disk is free under disk_path
    disk_path: ~/.cache/huggingface/hub   # default: the HF hub cache (where weights land)
    endpoint: http://127.0.0.1:8888        # what units benchmark; default: what metralectl serves here
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.errors import ExitCode, MetralError
from metralectl.wording import noun

DEFAULT_MEMORY_GB = 16.0
DEFAULT_DISK_GB = 50.0
_KEYS = ("enabled", "hardware_class", "floors", "disk_path", "endpoint")
_FLOOR_KEYS = ("memory_gb", "disk_gb")


class BenchConfigError(MetralError):
    """bench.yaml does not say what it must."""

    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class BenchConfig:
    enabled: bool = False
    hardware_class: str | None = None
    memory_floor_gb: float = DEFAULT_MEMORY_GB
    disk_floor_gb: float = DEFAULT_DISK_GB
    disk_path: Path | None = None
    endpoint: str | None = None  # None: the endpoint metralectl serves on this node (as `bench run` picks it)
    exists: bool = False  # False: no bench.yaml (the defaults above)

    def resolved_disk_path(self) -> Path:
        return self.disk_path if self.disk_path is not None else paths.hf_hub_cache()

    def to_yaml_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled}
        if self.hardware_class:
            out["hardware_class"] = self.hardware_class
        out["floors"] = {"memory_gb": self.memory_floor_gb, "disk_gb": self.disk_floor_gb}
        if self.disk_path is not None:
            out["disk_path"] = str(self.disk_path)
        if self.endpoint:
            out["endpoint"] = self.endpoint
        return out


def bench_path(base: Path | None = None) -> Path:
    return (base if base is not None else paths.config_dir()) / "bench.yaml"


def _number(value: Any, where: str, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise BenchConfigError(f"{paths.display(path)}: {where} must be a number of GB >= 0, not {value!r}")
    return float(value)


def load_bench_config(base: Path | None = None) -> BenchConfig:
    import yaml

    from metralectl.filecap import DOCUMENT_LIMIT, FileRefused, read_text

    path = bench_path(base)
    try:
        text = read_text(path, DOCUMENT_LIMIT, "bench config")
    except FileNotFoundError:
        return BenchConfig()
    except OSError as exc:
        raise BenchConfigError(f"cannot read {paths.display(path)}: {exc.strerror}") from None
    except FileRefused as exc:
        raise BenchConfigError(exc.message, exc.hint) from None
    except ValueError as exc:
        raise BenchConfigError(f"{paths.display(path)} is not UTF-8 text ({exc})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BenchConfigError(f"{paths.display(path)} is not valid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise BenchConfigError(f"{paths.display(path)}: expected a mapping of {', '.join(_KEYS)}")
    unknown = sorted(set(doc) - set(_KEYS))
    if unknown:
        raise BenchConfigError(f"{paths.display(path)}: unknown {noun(len(unknown), 'key')} {', '.join(map(str, unknown))}",
                               f"valid keys: {', '.join(_KEYS)}")
    enabled = doc.get("enabled", False)
    if not isinstance(enabled, bool):
        raise BenchConfigError(f"{paths.display(path)}: enabled must be true or false, not {enabled!r}")
    hw = doc.get("hardware_class")
    if hw is not None and not isinstance(hw, str):
        raise BenchConfigError(f"{paths.display(path)}: hardware_class must be a name like gb10, not {hw!r}")
    floors = doc.get("floors") or {}
    if not isinstance(floors, dict):
        raise BenchConfigError(f"{paths.display(path)}: floors must be a mapping of {', '.join(_FLOOR_KEYS)}")
    unknown = sorted(set(floors) - set(_FLOOR_KEYS))
    if unknown:
        raise BenchConfigError(f"{paths.display(path)}: unknown {noun(len(unknown), 'floor')} {', '.join(map(str, unknown))}",
                               f"valid floors: {', '.join(_FLOOR_KEYS)}")
    disk_path = doc.get("disk_path")
    if disk_path is not None and not isinstance(disk_path, str):
        raise BenchConfigError(f"{paths.display(path)}: disk_path must be a path")
    endpoint = doc.get("endpoint")
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
        raise BenchConfigError(f"{paths.display(path)}: endpoint must be an http(s):// URL, not {endpoint!r}",
                               "e.g. endpoint: http://127.0.0.1:8888 (or leave it out: what metralectl serves here)")
    return BenchConfig(
        enabled=enabled, hardware_class=hw or None, endpoint=endpoint.rstrip("/") if endpoint else None,
        memory_floor_gb=_number(floors.get("memory_gb", DEFAULT_MEMORY_GB), "floors.memory_gb", path),
        disk_floor_gb=_number(floors.get("disk_gb", DEFAULT_DISK_GB), "floors.disk_gb", path),
        disk_path=Path(disk_path).expanduser() if disk_path else None, exists=True)


def save_bench_config(config: BenchConfig, base: Path | None = None) -> Path:
    import yaml

    from metralectl.seams.store import write_atomic

    path = bench_path(base)
    header = "# metralectl bench.yaml: may peers granted `bench` run benchmark units on this node?\n"
    write_atomic(path, header + yaml.safe_dump(config.to_yaml_dict(), sort_keys=False), mode=0o600)
    return path
