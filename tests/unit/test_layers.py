"""The package's layers, enforced: a module may import only from its own layer or the ones below it.

The order (top first) is the one docs/ARCHITECTURE.md draws. Every import counts, including the lazy
ones inside functions (they are how the CLI keeps its start fast, and they are still dependencies).
A new upward import fails here with the importing file and line; a new import cycle between modules
fails unless it is listed in ALLOWED_CYCLES with its reason (mirrored in docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"

# Top first. Names in one tuple are siblings that may not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("tui",),
    ("agent",),
    ("gateway",),
    ("app", "present"),
    ("campaign",),
    ("peers",),
    ("bench",),
    ("telemetry",),
    ("doctor",),
    ("lifecycle",),
    ("seams",),
    ("core",),
    ("joblog",),
    ("ownedfs", "names", "filecap"),
    ("errors", "paths", "safetext", "atomicfile", "wording", "cancel", "__init__"),
]

# Inside a layer: its packages, each one outside system (seams/docker: the Docker daemon; seams/hf: the Hugging Face
# Hub and cache; seams/process: engines run as this host's processes), are siblings that may not import each other,
# and they sit above the layer's flat modules (the shared ones: seams/httpclient.py, bounded.py, store.py, ...),
# which may not import them.
SUBPACKAGES: dict[str, tuple[str, ...]] = {"seams": ("docker", "hf", "kube", "process")}

# Imports between two packages of a layer that are deliberate: (importer, imported), each a module or a package
# (a prefix), with the reason (mirrored in docs/ARCHITECTURE.md).
ALLOWED_BETWEEN: dict[tuple[str, str], str] = {
    ("seams.process", "seams.docker"):
        "the host-process runtime implements the container runtime contract seams/docker defines (ContainerRuntime, "
        "ContainerInfo, ImageState, RuntimeFailure, Endpoint) and returns its types",
    ("seams.docker.runtime", "seams.process.runtime"):
        "open_runtime opens the runtime an endpoint names: process://local is the host-process runtime (lazy)",
}


def _allowed_between(source: str, target: str) -> bool:
    def under(module: str, prefix: str) -> bool:
        return module == f"metralectl.{prefix}" or module.startswith(f"metralectl.{prefix}.")

    return any(under(source, a) and under(target, b) for a, b in ALLOWED_BETWEEN)


# Cycles between modules that are deliberate; each says why (docs/ARCHITECTURE.md, "Cycles").
# Imports under `if TYPE_CHECKING:` never run, so they make no cycle (they still count for the layers).
def _cycle(*names: str) -> frozenset[str]:
    return frozenset(f"metralectl.{n}" for n in names)


ALLOWED_CYCLES: dict[frozenset[str], str] = {
    _cycle("core.catalog", "core.synced_set"):
        "the catalog loads a synced engine release through synced_set, which checks those recipes "
        "with the catalog's own loader (both imports are lazy)",
    _cycle("bench.transport", "bench.transport_alt"):
        "the transport factory picks an alternative client only when asked (lazy); those clients "
        "share the base transport's stream parser",
    _cycle("tui.bench_adapter", "tui.bench_core"):
        "the adapter chooses the benchmark core only when the runner is installed (lazy); the core "
        "reads run details through the adapter",
    _cycle("cli.serve_cmds", "cli.multirank_cmds"):
        "serve commands hand multi-rank recipes to multirank_cmds (lazy), which prints with the "
        "same progress printer",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return found


def imports_of(name: str, path: Path, known: set[str], *, runtime_only: bool = False) -> Iterator[tuple[str, int]]:
    """(imported metralectl module, line) for every import statement in the file, lazy ones included;
    with runtime_only, those under `if TYPE_CHECKING:` are left out."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    typing_only = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        for target in targets:
            if not target.startswith("metralectl"):
                continue
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                yield target, node.lineno


def layer_of(module: str) -> tuple[int, str]:
    """(index in LAYERS, the top-level name) of a metralectl module."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(LAYERS):
        if top in names:
            return index, top
    raise AssertionError(f"{module}: its top-level name {top!r} is in no layer; add it to LAYERS (and the docs)")


def violations(graph: dict[str, list[tuple[str, int]]], files: dict[str, Path]) -> list[str]:
    found = []
    for source, edges in graph.items():
        s_index, s_top = layer_of(source)
        for target, line in edges:
            t_index, t_top = layer_of(target)
            if t_index < s_index or (t_index == s_index and t_top != s_top):
                where = files[source].relative_to(PACKAGE.parent) if source in files else source
                kind = "upward" if t_index < s_index else "sideways (siblings are independent)"
                found.append(f"{where}:{line}: imports {target} ({kind}: {s_top} -> {t_top})")
    return found


def sub_violations(graph: dict[str, list[tuple[str, int]]], files: dict[str, Path]) -> list[str]:
    """Imports inside a layer against SUBPACKAGES: between two of its packages, or from its flat modules into one."""
    found = []
    for source, edges in graph.items():
        s_parts = source.split(".")
        if len(s_parts) < 3 or s_parts[1] not in SUBPACKAGES:
            continue
        layer, packages = s_parts[1], SUBPACKAGES[s_parts[1]]
        s_package = s_parts[2] if s_parts[2] in packages else None  # a package's __init__ is the package
        for target, line in edges:
            t_parts = target.split(".")
            if len(t_parts) < 4 or t_parts[1] != layer or t_parts[2] not in packages or t_parts[2] == s_package:
                continue
            if s_package is not None and _allowed_between(source, target):
                continue
            where = files[source].relative_to(PACKAGE.parent) if source in files else source
            kind = (f"sideways: {layer}.{s_package} -> {layer}.{t_parts[2]}" if s_package is not None
                    else f"upward: {layer}'s flat modules -> {layer}.{t_parts[2]}")
            found.append(f"{where}:{line}: imports {target} ({kind})")
    return found


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative enough for this size)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def build_graph(*, runtime_only: bool = False) -> tuple[dict[str, list[tuple[str, int]]], dict[str, Path]]:
    files = modules()
    known = set(files)
    return {name: list(imports_of(name, path, known, runtime_only=runtime_only)) for name, path in files.items()}, files


def test_no_module_imports_upward_or_sideways() -> None:
    graph, files = build_graph()
    found = violations(graph, files)
    assert not found, "imports against the layers (docs/ARCHITECTURE.md):\n" + "\n".join(found)


def test_the_packages_inside_a_layer_keep_apart() -> None:
    graph, files = build_graph()
    found = sub_violations(graph, files)
    assert not found, "imports against a layer's packages (SUBPACKAGES, docs/ARCHITECTURE.md):\n" + "\n".join(found)


def test_the_check_catches_a_package_reaching_into_its_sibling() -> None:
    graph = {"metralectl.seams.hf.weights": [("metralectl.seams.docker.runtime", 4), ("metralectl.seams.bounded", 5)],
             "metralectl.seams.endpoint": [("metralectl.seams.hf.cache", 9)],
             "metralectl.seams.docker.images": [("metralectl.seams.docker.client", 2)]}
    found = sub_violations(graph, {})
    assert found == ["metralectl.seams.hf.weights:4: imports metralectl.seams.docker.runtime (sideways: seams.hf -> "
                     "seams.docker)",
                     "metralectl.seams.endpoint:9: imports metralectl.seams.hf.cache (upward: seams's flat modules -> "
                     "seams.hf)"], found


def test_the_allowed_imports_between_packages_are_only_those_listed() -> None:
    """The two deliberate edges pass, the reverse of each and any other between those packages does not."""
    graph = {"metralectl.seams.process.runtime": [("metralectl.seams.docker.containers", 1)],
             "metralectl.seams.docker.runtime": [("metralectl.seams.process.runtime", 2)],
             "metralectl.seams.docker.containers": [("metralectl.seams.process.state", 3)],
             "metralectl.seams.hf.weights": [("metralectl.seams.process.runtime", 4)]}
    found = sub_violations(graph, {})
    assert found == ["metralectl.seams.docker.containers:3: imports metralectl.seams.process.state (sideways: "
                     "seams.docker -> seams.process)",
                     "metralectl.seams.hf.weights:4: imports metralectl.seams.process.runtime (sideways: seams.hf -> "
                     "seams.process)"], found


def test_every_allowed_edge_between_packages_is_used() -> None:
    graph, _ = build_graph()
    used = {(a, b) for a, b in ALLOWED_BETWEEN
            if any(_allowed_between(source, target) and source.startswith(f"metralectl.{a}")
                   and target.startswith(f"metralectl.{b}") for source, edges in graph.items() for target, _ in edges)}
    assert used == set(ALLOWED_BETWEEN), f"ALLOWED_BETWEEN lists edges nobody uses: {set(ALLOWED_BETWEEN) - used}"


def test_no_unexplained_import_cycles() -> None:
    graph, _ = build_graph(runtime_only=True)
    unexplained = [sorted(c) for c in cycles(graph) if c not in ALLOWED_CYCLES]
    assert not unexplained, f"import cycles nobody justified: {unexplained}"


def test_every_allowed_cycle_still_exists() -> None:
    graph, _ = build_graph(runtime_only=True)
    stale = [sorted(c) for c in ALLOWED_CYCLES if c not in cycles(graph)]
    assert not stale, f"ALLOWED_CYCLES lists cycles that are gone (delete them here and in the docs): {stale}"


def test_the_check_catches_an_upward_and_a_sideways_import() -> None:
    """The checker itself: a core module importing the CLI, and app importing present, are both caught."""
    files = {"metralectl.core.recipe": PACKAGE / "core" / "recipe.py"}
    graph = {"metralectl.core.recipe": [("metralectl.cli.main", 7)],
             "metralectl.app.library": [("metralectl.present.table", 3)],
             "metralectl.cli.main": [("metralectl.core.recipe", 1)]}
    found = violations(graph, files)
    assert any(f.startswith("metralectl/core/recipe.py:7: imports metralectl.cli.main (upward") for f in found), found
    assert any("sideways" in f and "app -> present" in f for f in found), found
    assert len(found) == 2, found


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
