"""Find "free then bind" by AST: a socket bound to port 0 whose number outlives the socket.

The number is read with getsockname(); the socket is closed by its `with` block (or a return from inside it) or
by an explicit close(); if the number, or anything computed from it, is returned from there, stored on an object,
or used after the close, some other program may own that port by the time it is used (tests/ports.py says what
to do instead). Shell scripts: a `python -c` that binds port 0 and prints the number.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
SHELL_PICK = re.compile(r"bind\(\(\s*['\"][^'\"]*['\"]\s*,\s*0\s*\)\).*getsockname")


@dataclass(frozen=True)
class Finding:
    path: str
    where: str  # the function (or "<module>"), for the allow-list
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.where}): {self.why}"


def _binds_port_zero(node: ast.AST) -> str | None:
    """`X.bind((host, 0))` → "X"."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) >= 2
            and isinstance(node.args[0].elts[1], ast.Constant) and node.args[0].elts[1].value == 0):
        return ast.unparse(node.func.value)
    return None


NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _own_nodes(scope: Scope) -> Iterator[ast.AST]:
    """The scope's nodes, nested functions and classes left out (they are scopes of their own)."""
    todo: list[ast.AST] = [node for node in scope.body if not isinstance(node, NESTED)]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, NESTED))


def _number_of(value: ast.AST, derived: set[str], sock: str) -> bool:
    """Whether `value` is the port's number or text made from it (a call's result is something else: what a
    command printed, a server object, ... — only str() and int() of it are still the number)."""
    if isinstance(value, ast.Call):
        plain = isinstance(value.func, ast.Name) and value.func.id in ("str", "int")
        getsockname = isinstance(value.func, ast.Attribute) and value.func.attr == "getsockname"
        if not (plain or getsockname):
            return False
    return _mentions(value, derived, sock)


def _mentions(node: ast.AST, names: set[str], sock: str) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Name, ast.Attribute)) and ast.unparse(sub) in names:
            return True
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "getsockname"
                and ast.unparse(sub.func.value) == sock):
            return True
    return False


def _lifetime(scope: Scope, sock: str, bound_at: int) -> tuple[int, ast.With | None] | None:
    """(the line where the socket is closed, its `with` statement if that is what closes it), or None: it stays
    open when the scope ends (held, handed on, or kept by an object)."""
    for node in _own_nodes(scope):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno <= bound_at <= (node.end_lineno or 0):
            for item in node.items:
                if item.optional_vars is not None and ast.unparse(item.optional_vars) == sock:
                    return node.end_lineno or node.lineno, node  # type: ignore[return-value]
    closes = [node.lineno for node in _own_nodes(scope)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "close"
              and ast.unparse(node.func.value) == sock and node.lineno > bound_at]
    return (min(closes), None) if closes else None


def _scan_scope(scope: Scope, path: str, where: str) -> Iterator[Finding]:
    for bind in _own_nodes(scope):
        sock = _binds_port_zero(bind)
        if sock is None:
            continue
        life = _lifetime(scope, sock, bind.lineno)
        if life is None:
            continue
        closed_at, block = life
        derived: set[str] = set()
        assigns = sorted((n for n in _own_nodes(scope) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                          and bind.lineno <= n.lineno <= closed_at), key=lambda n: n.lineno)
        for node in assigns:  # in order, so `url = f"...{port}"` after `port = s.getsockname()[1]` counts
            if node.value is not None and _number_of(node.value, derived, sock):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, (ast.Name, ast.Attribute)) and isinstance(sub.ctx, ast.Store):
                            derived.add(ast.unparse(sub))
                            if isinstance(sub, ast.Attribute):  # self.port = …: it outlives the socket
                                yield Finding(path, where, node.lineno, f"stores the number of a port it "
                                              f"releases ({ast.unparse(sub)} outlives {sock})")
        for node in _own_nodes(scope):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Return) and node.value is not None and _mentions(node.value, derived, sock) \
                    and (block is not None and block.lineno <= line <= closed_at or line > closed_at):
                yield Finding(path, where, line, f"returns the number of a port it releases ({sock} is closed "
                              "on the way out)")
            elif line > closed_at and isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) \
                    and ast.unparse(node) in derived:
                yield Finding(path, where, line, f"uses {ast.unparse(node)} after {sock} released that port "
                              f"(line {closed_at})")


def scan_python(source: str, path: str) -> list[Finding]:
    tree = ast.parse(source)
    found: list[Finding] = list(_scan_scope(tree, path, "<module>"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.extend(_scan_scope(node, path, node.name))
    unique = {(f.line, f.why): f for f in found}
    return sorted(unique.values(), key=lambda f: f.line)


def scan_shell(text: str, path: str) -> list[Finding]:
    return [Finding(path, "<shell>", n, "prints the number of a port 0 bind, then exits (releasing it)")
            for n, line in enumerate(text.splitlines(), 1) if SHELL_PICK.search(line)]


def scan_tree(*roots: Path, base: Path) -> list[Finding]:
    found: list[Finding] = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            rel = str(path.relative_to(base))
            if path.suffix == ".py":
                found.extend(scan_python(path.read_text(), rel))
            elif path.suffix == ".sh":
                found.extend(scan_shell(path.read_text(), rel))
    return found
