"""What is being measured: URL, served model, /serve-config digests, /hardware, the recipe metralectl
served there (from its container labels), image revision, the engine (bench/engine_id.py). Control calls go
through the endpoint seam, not the hot path (bench/transport.py)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metralectl.bench import engine_id
from metralectl.bench.run_record import EngineIdentity, TargetRecord
from metralectl.seams.endpoint import EngineClient
from metralectl.errors import MetralError, UsageError

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime


class Control(EngineClient):
    """Control-plane calls to the engine for a benchmark: the endpoint seam's client, with its health as
    (status, text) and a longer default timeout."""

    def __init__(self, url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> None:
        super().__init__(url, timeout=timeout, headers=headers)

    def health(self, path: str = "/health") -> tuple[int | None, str]:  # type: ignore[override]
        answer = super().health(path)
        return answer.status, answer.error or answer.body[:200]

    def __enter__(self) -> Control:
        return self


@dataclass
class Target:
    url: str
    model: str | None
    serve_config_digests: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] | None = None
    hardware_class: str | None = None
    engine_version: str | None = None
    recipe: str | None = None
    spec_hash: str | None = None
    image: str | None = None
    image_revision: str | None = None
    container: str | None = None
    serve_flags: dict[str, Any] = field(default_factory=dict)
    engine: EngineIdentity | None = None  # what the server's answers show; the runner puts the recipe's when it serves

    def to_json(self) -> TargetRecord:
        return {"url": self.url, "model": self.model, "serve_config_digests": dict(self.serve_config_digests),
                "hardware": dict(self.hardware) if self.hardware is not None else None,
                "hardware_class": self.hardware_class, "engine_version": self.engine_version, "recipe": self.recipe,
                "spec_hash": self.spec_hash, "image": self.image, "image_revision": self.image_revision,
                "container": self.container, "serve_flags": dict(self.serve_flags),
                "engine": EngineIdentity(**self.engine) if self.engine is not None else None}


DIGEST_KEYS = ("binary_sha256", "args_sha256", "engine_version", "model", "served_model_name")


def describe(control: Control, *, managed: dict[str, Any] | None = None) -> Target:
    """Ask the engine what it is; `managed` is what metralectl's container labels say (when it served it)."""
    models = control.get_json("/v1/models")
    model = None
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        model = str(models["data"][0].get("id"))
    config = control.get_json("/serve-config")
    digests: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    if isinstance(config, dict):
        digests = {k: config[k] for k in DIGEST_KEYS if k in config}
        digests["serve_config_sha256"] = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
        if isinstance(config.get("flags"), dict):
            flags = dict(config["flags"])
    hardware = control.get_json("/hardware")
    hw_class = hardware.get("hardware_class") if isinstance(hardware, dict) else None
    engine_version = (hardware or {}).get("engine_version") if isinstance(hardware, dict) else None
    answers = engine_id.probe(control, models=models, serve_config=config, hardware=hardware)
    target = Target(control.url, model, digests, hardware if isinstance(hardware, dict) else None,
                    str(hw_class) if hw_class else None, engine_version or digests.get("engine_version"),
                    serve_flags=flags, engine=engine_id.detect(answers))
    if managed:
        target.recipe, target.spec_hash = managed.get("recipe"), managed.get("spec_hash")
        target.image, target.image_revision = managed.get("image"), managed.get("image_revision")
        target.container = managed.get("container")
    return target


DEFAULT_URL = "http://127.0.0.1:8888"  # where a benchmark looks when metralectl serves nothing: an engine started by hand


def managed_container(url: str | None) -> dict[str, Any] | None:
    """The metralectl container serving `url` (or the only one serving, when url is None), from its labels.
    None when Docker is not reachable or nothing matches: benchmarks do not need Docker."""
    try:
        from metralectl.lifecycle.local_runtime import open_local
        with open_local(timeout=5.0) as runtime:  # containers and host processes
            return _managed_on(runtime, url)
    except (MetralError, ImportError, OSError):
        return None


def endpoint_to_measure(url: str | None) -> tuple[str, dict[str, Any] | None]:
    """The endpoint a benchmark measures and metralectl's container there: `url` when given; else the model
    metralectl serves; else an engine started by hand at DEFAULT_URL, when one answers there. Else the one
    answer for nothing served (errors.NotServed, exit 1) — or, when Docker could not be asked, Docker's own
    error (exit 69): then nothing is known about what serves."""
    if url:
        return url, managed_container(url)
    from metralectl.errors import NotServed, RUN_ONE
    from metralectl.seams.endpoint import health_once

    docker: MetralError | None = None
    try:
        from metralectl.lifecycle.local_runtime import open_local
        with open_local(timeout=5.0) as runtime:  # containers and host processes
            found = _managed_on(runtime, None)
            serving = [c for c in runtime.containers(mine=False) if c.running]
    except MetralError as exc:
        found, serving, docker = None, [], exc
    if found is not None:
        return str(found["url"]), found
    if health_once(DEFAULT_URL, timeout=2.0).status is not None:
        return DEFAULT_URL, None
    if docker is not None:
        docker.hint = f"{docker.hint or ''}; or `--url URL` benchmarks an endpoint without asking Docker".lstrip("; ")
        raise docker
    if serving:  # several models serve, or ours publish no endpoint: which one is for --url to say
        names = ", ".join(sorted(c.name for c in serving))
        raise UsageError(f"{len(serving)} metralectl engines serve ({names}): which one?",
                          "`metralectl bench run SUITE --url URL` names it (`metralectl ps` shows the endpoints)")
    raise NotServed(hint=f"{RUN_ONE}; `--self-start RECIPE` serves one for this run; `--url URL` benchmarks "
                         f"another endpoint (nothing answers at {DEFAULT_URL} either)")


def _managed_on(runtime: ContainerRuntime, url: str | None) -> dict[str, Any] | None:
    from metralectl.lifecycle.launch import LABEL_ENDPOINT
    from metralectl.core.render import LABEL_RECIPE, LABEL_SPEC_HASH

    running = [c for c in runtime.containers(mine=False) if c.running and c.labels.get(LABEL_ENDPOINT)]
    norm = (url or "").rstrip("/").removesuffix("/v1")
    chosen = [c for c in running if url is None or c.labels[LABEL_ENDPOINT].rstrip("/") == norm]
    if len(chosen) != 1:
        return None
    c = chosen[0]
    try:
        revision = runtime.image_state(c.image).revision
    except MetralError:
        revision = None
    return {"recipe": c.labels.get(LABEL_RECIPE), "spec_hash": c.labels.get(LABEL_SPEC_HASH), "image": c.image,
            "image_revision": revision, "container": c.name, "url": c.labels[LABEL_ENDPOINT], "labels": dict(c.labels)}


def served_context(control: Control) -> tuple[int | None, str | None]:
    """The context one request may fill, as the server says it: vLLM/SGLang's /v1/models max_model_len, else
    llama.cpp's /props (a slot's n_ctx); (None, None) when it does not say."""
    models = control.get_json("/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    if isinstance(first.get("max_model_len"), int) and first["max_model_len"] > 0:
        return first["max_model_len"], f"{first['max_model_len']} (max_model_len of /v1/models)"
    props = control.get_json("/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n_ctx, int) and n_ctx > 0:
        return n_ctx, f"{n_ctx} (n_ctx of /props: one slot's context)"
    return None, None


def api_rtt_ms(control: Control, tries: int = 3) -> float | None:
    """Network latency as llama-benchy's default `--latency-mode api` measures it: the mean of three
    `GET /v1/models`, in ms (taken off the time to first response in the depth suite's pp). Its connection is
    opened first, unmeasured: llama-benchy's session is already open from its warm-up when it measures."""
    if control.get_json("/v1/models") is None:
        return None
    times = []
    for _ in range(tries):
        t = time.perf_counter()
        if control.get_json("/v1/models") is None:
            return None
        times.append((time.perf_counter() - t) * 1000)
    return round(sum(times) / len(times), 3)
