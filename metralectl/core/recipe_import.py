"""Engine recipe (recipe_version "2", the engine's recipes/<family>/<name>.yaml) -> our recipe document.

Used by `metralectl recipes sync` on a release's recipes, and to re-express the engine's certified
recipes as shipped ones. The upstream file is parsed with our YAML 1.2 reader (`off` stays a word);
keys that carry executable content are refused, as the reference launcher refuses them; every
`defaults:` key must be a flag of the revision the recipe is checked against (an unknown flag is a
problem, never dropped); launch facts become our `resources:`; a flag the recipe leaves to a clap
default is written out with that default, so nothing is inherited silently. The converted document
is then checked by the recipe checker, with every problem located in the upstream file.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from metralectl import names
from metralectl.core.engines.registry import the_builtin
from metralectl.errors import Problem
from metralectl.core.recipe import Recipe, RecipeOrigin
from metralectl.core.schema import did_you_mean, type_name
from metralectl.core.yamlsrc import Document, KeyPath, YamlSyntax, load_text
from metralectl.safetext import clean

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.engine_flags import FlagSpec
    from metralectl.core.engine_revisions import Revision
    from metralectl.core.image_info import ImageInfo

# Keys the reference launcher refuses because they carry executable content, plus the isolation key
# only its launch profile may set (Metrale/metralectl crates/metralectl-core/src/recipe/raw.rs@5e6c4dd,
# EXECUTABLE_KEYS and ISOLATION_KEYS). `command` is refused too: metralectl renders `met serve` from the
# contract and never runs a recipe's command template.
EXECUTABLE_KEYS = ("pre_exec", "post_exec", "post_commands", "stop_after_post", "mods", "builder",
                   "builder_config", "executor_config", "command")
KNOWN_KEYS = ("recipe_version", "model", "model_revision", "runtime", "runtime_version", "container", "mode",
              "min_nodes", "max_nodes", "solo_only", "cluster_only", "description", "metadata", "defaults", "env")
QUANTS = ("nvfp4", "fp8", "bf16", "mxfp4")
HEAD_PORT_STEP = 1  # the worker of a two-rank recipe listens beside the head (8888 -> 8889)


@dataclass(frozen=True)
class UpstreamFile:
    id: str  # family/stem, the engine's recipe id
    path: str  # where it sits in the release or repository, e.g. recipes/qwen3.5/x.yaml
    data: bytes
    sha256: str


@dataclass(frozen=True)
class ImportContext:
    catalog: Catalog
    revision: Revision  # what the recipe is checked against (a release's, or a shipped revision)
    repo: str  # e.g. Metrale/metrale-inference
    commit: str
    release: str | None
    taken: str  # YYYY-MM-DD
    display: str = ""  # how problems name the upstream file (default: its path)


@dataclass
class Imported:
    id: str
    name: str | None = None
    data: dict[str, Any] | None = None  # our recipe document
    recipe: Recipe | None = None
    problems: list[Problem] = field(default_factory=list)
    pinned_defaults: list[str] = field(default_factory=list)  # keys written from the release's clap defaults

    @property
    def ok(self) -> bool:
        return self.recipe is not None and not any(p.severity == "error" for p in self.problems)

    def text(self, header: str = "") -> str:
        body: str = yaml.dump(self.data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)
        return header + body


class _Dumper(yaml.SafeDumper):
    """safe_dump, with every string holding a character that is not printable (a line break, NEL, U+2028,
    an escape) written double-quoted, where each is an escape: PyYAML's single-quoted style writes NEL raw
    and reads it back as a space, so the file would not say what was converted."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = None if value.isprintable() else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


class _Conversion:
    def __init__(self, upstream: Document, ctx: ImportContext) -> None:
        self.up = upstream
        self.ctx = ctx
        self.problems: list[Problem] = []
        self.trace: dict[KeyPath, KeyPath] = {}  # our key path -> upstream key path

    def error(self, keypath: KeyPath, message: str, hint: str | None = None) -> None:
        self.problems.append(self.up.problem(keypath, message, hint))

    def warn(self, keypath: KeyPath, message: str, hint: str | None = None) -> None:
        self.problems.append(self.up.problem(keypath, message, hint, severity="warning"))


def convert(upstream: UpstreamFile, ctx: ImportContext) -> Imported:
    display = f"{ctx.display or upstream.path}"
    result = Imported(upstream.id)
    try:
        doc = load_text(upstream.data, display)
    except YamlSyntax as exc:
        result.problems.append(exc.problem)
        return result
    conv = _Conversion(doc, ctx)
    top = doc.data if isinstance(doc.data, dict) else None
    if top is None:
        conv.error((), f"an engine recipe is a mapping, not {type_name(doc.data)}")
        result.problems = conv.problems
        return result
    data = _document(conv, top, upstream, result)
    result.problems = conv.problems
    if data is None or any(p.severity == "error" for p in conv.problems):
        return result
    result.data = data
    ours = Document(display, data)
    ours.marks = {ourkey: doc.where(upkey) for ourkey, upkey in conv.trace.items()}
    ours.marks[()] = doc.where(())
    origin = RecipeOrigin("synced" if ctx.revision.synced else "file", display, release=ctx.release)
    recipe, problems = ctx.catalog.check_document(ours, origin)
    result.recipe = recipe
    result.problems += problems
    return result


def _document(conv: _Conversion, top: dict[str, Any], upstream: UpstreamFile, result: Imported) -> dict[str, Any] | None:
    ctx = conv.ctx
    for key in top:
        if key in EXECUTABLE_KEYS:
            conv.error((key,), f"`{key}` carries executable content; metralectl never runs recipe-supplied "
                               "commands, so the recipe is refused",
                       "do that step yourself before launching, or ask the engine to drop it from the recipe")
        elif key not in KNOWN_KEYS:
            conv.warn((key,), f"unknown key {key!r} is not applied")
    engine = the_builtin("publishes_recipe_sets")  # its recipe format names itself as the runtime
    if top.get("runtime") != engine:
        conv.error(("runtime",), f"runtime {top.get('runtime')!r}: metralectl launches the `{engine}` runtime only")
    if str(top.get("recipe_version")) != "2":
        conv.error(("recipe_version",), f"recipe_version {top.get('recipe_version')!r}: this importer reads \"2\"")
    name = upstream.id.rsplit("/", 1)[-1].lower()
    if not names.is_valid("recipe name", name):  # it becomes a file name: `<name>.yaml` in the synced set
        conv.error((), f"recipe id {clean(upstream.id)!r} does not make a recipe name (lower-case letters, digits, "
                       ". _ -)")
    result.name = name
    model = top.get("model")
    if not isinstance(model, str) or not model.strip() or model.strip().startswith("-"):
        conv.error(("model",), f"model must be a Hugging Face id, not {type_name(model)}")
        return None
    image = _image(conv, top)
    quant = _quant(conv, top)
    if image is None or quant is None:
        return None
    hardware = image.hardware[0]
    if not any(m.checkpoint(model) for m in ctx.catalog.models_for(hardware).values()):
        conv.error(("model",), f"no kernel model on {hardware} is known to serve {model}",
                   "metralectl needs the model's facts in kernels/ to target and size it; the recipe is left out")
        return None
    defaults: dict[str, Any] = top["defaults"] if isinstance(top.get("defaults"), dict) else {}
    if not isinstance(top.get("defaults"), dict):
        conv.error(("defaults",), "an engine recipe's `defaults:` must be a mapping of serve flags")
    serve, resources = _settings(conv, defaults)
    result.pinned_defaults = _pin_defaults(conv, serve)
    nodes = top.get("min_nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        conv.error(("min_nodes",), f"min_nodes must be a positive whole number, not {type_name(nodes)}")
        return None
    _ranks(conv, resources, nodes)
    metadata: dict[str, Any] = top["metadata"] if isinstance(top.get("metadata"), dict) else {}
    description = str(metadata.get("description") or top.get("description") or upstream.id).strip()
    tags = [t for t in (metadata.get("category"),) if isinstance(t, str) and t]
    tags += (["ep2"] if nodes == 2 else []) + (["mtp"] if serve.get("speculative") is True else [])
    data: dict[str, Any] = {
        "schema": 1, "name": name, "description": description.splitlines()[0][:200],
        "engine": the_builtin("publishes_recipe_sets"), "engine-revision": ctx.revision.id, "source": "engine",
        "provenance": {"repo": ctx.repo, "path": upstream.path, "commit": ctx.commit, "sha256": upstream.sha256,
                       "taken": ctx.taken, **({"release": ctx.release} if ctx.release else {})},
        "checkpoint": {"repo": model.strip(), "quant": quant, "revision": top.get("model_revision")},
        "hardware": hardware, "image": image.id, "serve": serve, "resources": resources,
        "env": _env(conv, top), "tags": tags,
        "validated": {"source": f"engine recipe {upstream.id}" + (f" (release {ctx.release})" if ctx.release else ""),
                      "engine-revision": ctx.commit, "hardware": hardware, "date": None, "decode-tok-s": None},
    }
    for ours, up in (("checkpoint", "model"), ("image", "container"), ("hardware", "container"),
                     ("engine-revision", "recipe_version"), ("env", "env")):
        conv.trace[(ours,)] = (up,)
    conv.trace[("serve",)] = ("defaults",)
    conv.trace[("resources",)] = ("defaults",)
    return data


def _image(conv: _Conversion, top: dict[str, Any]) -> ImageInfo | None:
    container = top.get("container")
    if not isinstance(container, str) or not container.strip() or container.strip().startswith("-"):
        conv.error(("container",), f"container must be an image reference, not {type_name(container)}")
        return None
    repo, _, tag = container.strip().rpartition(":") if ":" in container.rsplit("/", 1)[-1] else (container, "", "")
    for image in conv.ctx.catalog.images.values():
        ref_repo, _, ref_tag = image.ref.rpartition(":")
        if ref_repo == repo.strip():
            if tag and tag != ref_tag:
                conv.warn(("container",), f"the engine recipe runs {container.strip()}; metralectl runs its "
                                          f"`{image.id}` image ({image.ref})")
            return image
    conv.error(("container",), f"no image metralectl knows runs {container.strip()}",
               "add it under images/ (your config dir's images/ for a local one)")
    return None


def _quant(conv: _Conversion, top: dict[str, Any]) -> str | None:
    metadata: dict[str, Any] = top["metadata"] if isinstance(top.get("metadata"), dict) else {}
    for key in ("quantization", "model_dtype"):
        words: list[str] = re.findall(r"[a-z0-9]+", str(metadata.get(key) or "").lower())
        if words and words[0] in QUANTS:
            return words[0]
    conv.error(("metadata",), "the recipe states no checkpoint quantization metralectl knows "
                              f"(metadata.quantization / model_dtype: one of {', '.join(QUANTS)})")
    return None


def _coerce(spec: FlagSpec, value: object) -> object:
    """The engine passes every value as text; read numeric and boolean text as what it means."""
    if not isinstance(value, str):
        return value
    if spec.type == "flag" and value in ("true", "false"):
        return value == "true"
    for kind, convert in (("int", int), ("float", float)):
        if spec.type == kind and value not in spec.words:
            try:
                return convert(value)
            except ValueError:
                return value
    return value


def _settings(conv: _Conversion, defaults: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    revision, contract = conv.ctx.revision, conv.ctx.catalog.engines[the_builtin("publishes_recipe_sets")]
    serve: dict[str, Any] = {}
    resources: dict[str, Any] = {}
    for key, raw in defaults.items():
        where: KeyPath = ("defaults", key)
        name = str(key).replace("_", "-")
        spec = revision.specs.get(contract.aliases.get(name, name))
        if spec is None:
            spellings = [s.recipe_keys[0] if s.recipe_keys else n.replace("-", "_") for n, s in revision.specs.items()]
            guess = did_you_mean(str(key), spellings)
            conv.error(where, f"`{key}` is not a flag of engine revision {revision.label}",
                       f"did you mean `{guess}`?" if guess else None)
            continue
        value = _coerce(spec, raw)
        if spec.recipe == "resources" and spec.resource:
            resources[spec.resource] = value
            conv.trace[("resources", spec.resource)] = where
        elif spec.recipe == "launcher":
            conv.error(where, f"`{key}` is set by the launcher (from the recipe's nodes), not by a recipe")
        elif spec.recipe == "forbidden":
            conv.error(where, f"`{key}` cannot be set in a recipe: {spec.reason}")
        elif value is False and not revision.policy.false_allowed and spec.type == "flag":
            continue  # this revision spells "off" by leaving the flag out
        else:
            serve[spec.name] = value
            conv.trace[("serve", spec.name)] = where
    bind = resources.get("bind")
    if bind is not None:
        try:
            loopback = ipaddress.ip_address(str(bind)).is_loopback
        except ValueError:
            loopback = True  # the checker reports a bind that is not an address
        if not loopback:
            conv.warn(conv.trace[("resources", "bind")], f"the engine recipe binds {bind}; metralectl binds "
                                                         "127.0.0.1 (expose deliberately: resources.bind with auth)")
            resources["bind"] = "127.0.0.1"
    return serve, resources


def _pin_defaults(conv: _Conversion, serve: dict[str, Any]) -> list[str]:
    revision = conv.ctx.revision
    pinned = []
    for spec in revision.specs.values():
        if spec.name in serve or spec.recipe != "setting" or spec.name in revision.policy.excluded:
            continue
        if spec.type == "flag":
            if revision.policy.false_allowed:
                serve[spec.name] = False
                pinned.append(spec.name)
        elif spec.default is not None:
            serve[spec.name] = spec.default
            pinned.append(spec.name)
    order = list(revision.specs)
    serve_sorted = dict(sorted(serve.items(), key=lambda kv: order.index(kv[0])))
    serve.clear()
    serve.update(serve_sorted)
    return pinned


def _ranks(conv: _Conversion, resources: dict[str, Any], nodes: int) -> None:
    specs = conv.ctx.revision.specs
    resources.setdefault("port", specs["port"].default if "port" in specs else 8888)
    resources.setdefault("bind", "127.0.0.1")
    resources.setdefault("memory-utilization", specs["gpu-memory-utilization"].default)
    resources["gpus"] = "all"
    if nodes == 1:
        resources["ranks"] = 1
        resources.pop("master-port", None)  # a launch fact of multi-rank recipes only
        return
    port = resources["port"]
    resources["ranks"] = [{"role": "head", "port": port}] + [
        {"role": "worker", "port": port + HEAD_PORT_STEP * i} for i in range(1, nodes)]
    resources.setdefault("master-port", specs["master-port"].default if "master-port" in specs else 29500)
    resources.setdefault("tp-size", 1)
    resources.setdefault("ep-size", 1)
    resources["nodes"] = nodes


def _env(conv: _Conversion, top: dict[str, Any]) -> dict[str, Any]:
    env = top.get("env")
    if env is None:
        return {}
    if not isinstance(env, dict):
        conv.error(("env",), f"`env:` must be a mapping, not {type_name(env)}")
        return {}
    for name in env:
        conv.trace[("env", name)] = ("env", name)
    return dict(env)
