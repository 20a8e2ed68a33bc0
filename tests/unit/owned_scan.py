"""Finds filesystem changes in a module's source that do not go through metralectl.ownedfs.Owned.

Used by the call-site tests (the HF cache's modules, the recipe sync's): every write, rename, link and
removal there must be an `Owned` method, so a path from outside can never be used unchecked. The scan
reads the AST: a call whose function name is one of pathlib's, os's or shutil's changing operations (or
atomicfile's, or builtin open() with a writing mode) is reported with its line, whatever object it is
called on; Owned's own methods have names none of those use.
"""

from __future__ import annotations

import ast
from pathlib import Path

# Names of calls that change the filesystem, in pathlib, os, shutil and our atomicfile.
CHANGING = frozenset({
    "unlink", "remove", "rename", "replace", "renames", "symlink", "symlink_to", "hardlink_to", "link_to",
    "link", "mkdir", "makedirs", "rmdir", "removedirs", "rmtree", "move", "copy", "copy2", "copyfile",
    "copytree", "write_text", "write_bytes", "touch", "truncate", "ftruncate", "chmod", "lchmod", "chown",
    "mkfifo", "mknod", "write_atomic", "write_json_atomic", "place", "symlink_atomic", "mkdtemp", "mkstemp",
    "NamedTemporaryFile", "TemporaryDirectory", "extractall", "extract",
})
# Owned's methods: what a module is expected to call instead.
OWNED_METHODS = frozenset({"put", "remove_file", "remove_dir", "remove_tree", "move", "link", "make_dirs",
                           "open_write", "chmod", "read_bytes", "open_read", "stat_inside", "resolve", "lstat",
                           "listdir", "link_target", "is_dir", "make_root"})
WRITE_MODES = ("w", "a", "x", "+")


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _open_mode(call: ast.Call) -> str | None:
    mode: ast.expr | None = call.args[1] if len(call.args) > 1 else None
    for kw in call.keywords:
        if kw.arg == "mode":
            mode = kw.value
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "?"


def direct_changes(source: Path) -> list[str]:
    """`file:line: call` for every filesystem change that bypasses Owned (`move`/`link`/`chmod` on an object
    whose name says Owned — `owned`, `cache`, `box`, `root_owned` … — are Owned's own and not reported)."""
    tree = ast.parse(source.read_text(), str(source))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name is None:
            continue
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        on_owned = isinstance(receiver, ast.Name) and _is_owned_name(receiver.id) or (
            isinstance(receiver, ast.Attribute) and _is_owned_name(receiver.attr))
        if name == "replace" and _not_a_file_replace(node):
            continue
        if name in CHANGING and not (on_owned and name in OWNED_METHODS):
            found.append(f"{source.name}:{node.lineno}: {ast.unparse(node.func)}()")
        elif name == "open" and isinstance(node.func, ast.Name):
            mode = _open_mode(node)
            if mode == "?" or any(m in (mode or "") for m in WRITE_MODES):
                found.append(f"{source.name}:{node.lineno}: open(..., {mode!r})")
        elif name == "open" and isinstance(node.func, ast.Attribute) and ast.unparse(node.func) == "os.open":
            found.append(f"{source.name}:{node.lineno}: os.open()")
    return sorted(found)


def _not_a_file_replace(call: ast.Call) -> bool:
    """str.replace("/", "--") (constant strings) and dataclasses.replace(x, field=...) (keywords) change no file."""
    constants = call.args and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)
    return bool(constants) or bool(call.keywords)


def _is_owned_name(name: str) -> bool:
    return "owned" in name.lower() or name in ("cache", "box", "synced")


def owned_calls(source: Path) -> list[str]:
    """`line: receiver.method` for every call of an Owned method on an Owned-named object (the call sites)."""
    tree = ast.parse(source.read_text(), str(source))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in OWNED_METHODS:
            receiver = node.func.value
            if (isinstance(receiver, ast.Name) and _is_owned_name(receiver.id)) or (
                    isinstance(receiver, ast.Attribute) and _is_owned_name(receiver.attr)):
                out.append(f"{node.lineno}: {ast.unparse(node.func)}")
    return out
