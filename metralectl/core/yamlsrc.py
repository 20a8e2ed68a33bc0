"""YAML documents that remember where every value came from.

The checker must name the file, line and column of each problem, refuse duplicate keys and read
booleans the YAML 1.2 way (only true/false: `tool-grammar: off` is the word "off", not False).
PyYAML's composer gives us nodes with marks; we build plain values from them and keep a map
from key path to (line, column).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import Problem
from metralectl.safetext import clean

if TYPE_CHECKING:
    import yaml

KeyPath = tuple[Any, ...]
_MAX_NODES = 200_000  # alias bombs ("billion laughs") stop here instead of eating memory


@lru_cache(maxsize=1)
def _yaml() -> tuple[Any, Any]:
    """(loader class, scalar constructor), built on first parse: a cached catalog needs no YAML (~12 ms)."""
    import yaml

    base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _Loader(base):  # type: ignore[misc, valid-type]
        """Safe loader with YAML 1.2 booleans and no timestamp magic (dates stay strings)."""

    _Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return _Loader, yaml.constructor.SafeConstructor()


@dataclass
class Document:
    """Plain data plus the position of every key and value in the source."""

    path: str
    data: Any
    marks: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    origins: dict[KeyPath, str] = field(default_factory=dict)  # keypath -> file, for merged documents

    def where(self, keypath: KeyPath) -> tuple[int, int]:
        """(line, column) of keypath, else of its nearest ancestor that exists."""
        probe = tuple(keypath)
        while probe:
            if probe in self.marks:
                return self.marks[probe]
            probe = probe[:-1]
        return self.marks.get((), (1, 1))

    def origin(self, keypath: KeyPath) -> str:
        probe = tuple(keypath)
        while probe:
            if probe in self.origins:
                return self.origins[probe]
            probe = probe[:-1]
        return self.path

    def problem(self, keypath: KeyPath, message: str, hint: str | None = None, severity: str = "error") -> Problem:
        line, column = self.where(keypath)
        return Problem(self.origin(keypath), line, column, dotted(keypath), message, hint, severity)


def overlay(base: Document, top: Document, drop: tuple[str, ...] = ()) -> Document:
    """top's values over base's (mappings merge, anything else replaces); positions follow the winner."""
    merged = Document(top.path, _merge(base.data, top.data))
    if isinstance(merged.data, dict):
        for key in drop:
            merged.data.pop(key, None)
    merged.marks.update(base.marks)
    merged.origins.update({path: base.origin(path) for path in base.marks})
    for path, mark in top.marks.items():
        merged.marks[path] = mark
        merged.origins[path] = top.origin(path)
    return merged


# Any here and in _Builder: a YAML document's values, whose shape the schema readers check, not this module
def _merge(base: Any, top: Any) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for key, value in top.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return top


def dotted(keypath: KeyPath) -> str:
    """`serve.max-seq-len`, `resources.ranks[1].port`; a key's control characters shown escaped (a problem's
    key reaches the terminal)."""
    out = ""
    for part in keypath:
        part = part if isinstance(part, int) else clean(str(part), 80)
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


class YamlSyntax(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def load_file(path: Path, display_name: str | None = None) -> Document:
    """The file's YAML document: a regular file of at most filecap.DOCUMENT_LIMIT (else one problem, as for a
    file that cannot be read: a FIFO, a device or a sparse terabyte is never read)."""
    from metralectl.filecap import DOCUMENT_LIMIT, FileRefused, read_bytes

    name = display_name or str(path)
    try:
        text = read_bytes(path, DOCUMENT_LIMIT)
    except OSError as exc:
        raise YamlSyntax(Problem(name, 0, 0, "", f"cannot read the file: {exc.strerror or exc}")) from None
    except FileRefused as exc:
        raise YamlSyntax(Problem(name, 0, 0, "", exc.message, exc.hint)) from None
    return load_text(text, name)


def load_text(text: str | bytes, name: str) -> Document:
    """Parse one YAML document; any syntax problem raises YamlSyntax with its position."""
    import yaml

    try:
        node = yaml.compose(text, Loader=_yaml()[0])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        what = exc.problem or exc.context or "invalid YAML"
        raise YamlSyntax(Problem(name, line, column, "", f"YAML syntax error: {what}",
                                 "check the indentation and quoting around this spot")) from None
    except yaml.reader.ReaderError as exc:  # bad encoding, control characters: say where, by line
        raise YamlSyntax(_reader_problem(name, text, exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntax(Problem(name, 0, 0, "", f"not a readable YAML file: {exc}",
                                 "save the file as UTF-8 text")) from None
    except RecursionError:
        raise YamlSyntax(Problem(name, 0, 0, "", "the document nests too deeply")) from None
    doc = Document(name, None)
    if node is None:
        doc.data = None
        return doc
    builder = _Builder(doc)
    doc.data = builder.build(node, ())
    if builder.problems:
        raise YamlSyntax(builder.problems[0])
    return doc


def _reader_problem(name: str, text: str | bytes, exc: Any) -> Problem:
    """A byte the YAML reader refuses, by line and column (the reader counts bytes, or characters)."""
    position = int(getattr(exc, "position", 0) or 0)
    before = text[:position]
    newline: Any = b"\n" if isinstance(before, bytes) else "\n"
    line = before.count(newline) + 1
    column = position - (before.rfind(newline) + 1) + 1
    character = getattr(exc, "character", None)
    if "control characters" not in str(getattr(exc, "reason", "")) and isinstance(character, int):
        return Problem(name, line, column, "", f"byte 0x{character:02x} is not UTF-8 text",
                       "save the file as UTF-8 (an editor's \"encoding\" setting), or remove the byte")
    if not isinstance(character, int):
        return Problem(name, line, column, "", f"not a readable YAML file: {getattr(exc, 'reason', exc)}",
                       "save the file as UTF-8 text")
    label = "a NUL byte" if character == 0 else f"the control character U+{character:04X}"
    return Problem(name, line, column, "", f"{label} is not allowed in YAML text",
                   "remove it (a recipe is plain text); a value that needs it is written with an escape, in quotes")


# YAML 1.1 (what PyYAML reads) takes `010000` as octal 4096 and `1:30` as 90: refused rather than guessed.
_LEGACY_INT = re.compile(r"^[-+]?(?:0[0-9_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+)$")


class _Builder:
    def __init__(self, doc: Document) -> None:
        import yaml

        self.yaml = yaml  # imported by load_text already; kept here so the recursion does not re-import
        self.scalars = _yaml()[1]
        self.doc = doc
        self.problems: list[Problem] = []
        self.count = 0
        self.active: set[int] = set()

    def _problem(self, node: yaml.Node, keypath: KeyPath, message: str, hint: str | None = None) -> None:
        mark = node.start_mark
        self.problems.append(Problem(self.doc.path, mark.line + 1, mark.column + 1, dotted(keypath), message, hint))

    def build(self, node: yaml.Node, keypath: KeyPath) -> Any:
        pyyaml = self.yaml
        self.count += 1
        if self.count > _MAX_NODES:
            if not self.problems:
                self._problem(node, keypath, "the document is too large (alias expansion?)")
            return None
        self.doc.marks.setdefault(keypath, (node.start_mark.line + 1, node.start_mark.column + 1))
        if id(node) in self.active:
            self._problem(node, keypath, "a recursive alias refers to itself")
            return None
        if isinstance(node, pyyaml.ScalarNode):
            return self._scalar(node, keypath)
        self.active.add(id(node))
        try:
            if isinstance(node, pyyaml.SequenceNode):
                return [self.build(child, keypath + (i,)) for i, child in enumerate(node.value)]
            return self._mapping(node, keypath)
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode, keypath: KeyPath) -> Any:
        pyyaml, scalars = self.yaml, self.scalars
        constructor = scalars.yaml_constructors.get(node.tag)
        if constructor is None or node.tag in ("tag:yaml.org,2002:binary", "tag:yaml.org,2002:timestamp"):
            if node.tag.startswith("tag:yaml.org,2002:") and node.tag != "tag:yaml.org,2002:str":
                self._problem(node, keypath, f"unsupported YAML tag {node.tag!r}", "write a plain value")
                return None
            return str(node.value)
        if node.tag == "tag:yaml.org,2002:int" and not node.style and _LEGACY_INT.match(node.value):
            self._problem(node, keypath, f"{node.value} is ambiguous: YAML 1.1 reads it as "
                                         f"{constructor(scalars, node)}, YAML 1.2 otherwise",
                          f"write {node.value.replace('_', '').lstrip('0') or '0'} for the decimal number, or quote it "
                          "for text" if ":" not in node.value else "quote it for text")
            return None
        try:
            value = constructor(scalars, node)
        except (ValueError, TypeError, pyyaml.YAMLError):
            self._problem(node, keypath, f"cannot read {node.value!r} as {node.tag.rsplit(':', 1)[-1]}")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self._problem(node, keypath, f"{node.value} is not a finite number",
                          "write a finite value (no .inf, .nan, or a number past 1.8e308)")
            return None
        return value

    def _mapping(self, node: yaml.MappingNode, keypath: KeyPath) -> dict[Any, Any]:
        pyyaml = self.yaml
        out: dict[Any, Any] = {}
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, pyyaml.ScalarNode):
                self._problem(key_node, keypath, "a key must be a plain word, not a list or mapping")
                continue
            key = self._scalar(key_node, keypath)
            if key is None and key_node.tag == "tag:yaml.org,2002:null":
                key = "null" if key_node.value == "" else key_node.value
            if not isinstance(key, (str, int, float, bool)):
                key = str(key)
            if key in seen:
                first = seen[key].start_mark
                self._problem(key_node, keypath + (key,), f"duplicate key {key!r} (first written on line {first.line + 1})",
                              "keep one of the two; YAML would silently use the last")
                continue
            seen[key] = key_node
            self.doc.marks[keypath + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = self.build(value_node, keypath + (key,))
        return out
