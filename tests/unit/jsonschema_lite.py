"""A JSON Schema validator for the keywords llm-d's BR v0.2 schema uses (no jsonschema package in the test venv).

Supported: $ref (local "#/$defs/..."), type, properties, required, additionalProperties (bool or schema), items,
enum, const, anyOf, oneOf (exactly one), minimum, exclusiveMinimum, format date-time. Annotations (title,
description, default, discriminator) are ignored, as a validator ignores them; pydantic's non-standard "ge" is
checked as minimum. An unknown keyword is an error here, so a schema that grows one is not half-checked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

ANNOTATIONS = {"title", "description", "default", "discriminator", "$defs", "examples"}
KNOWN = ANNOTATIONS | {"$ref", "type", "properties", "required", "additionalProperties", "items", "enum", "const",
                       "anyOf", "oneOf", "minimum", "exclusiveMinimum", "format", "ge"}
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[name])


def errors(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    unknown = set(schema) - KNOWN
    if unknown:
        return [f"{path}: the validator does not know {sorted(unknown)}"]
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        return errors(value, root["$defs"][ref.split("/")[-1]], root, path)
    out: list[str] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_type_ok(value, n) for n in names):
            return [f"{path}: {value!r:.60} is not {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    for key in ("minimum", "ge"):
        if key in schema and _type_ok(value, "number") and value < schema[key]:
            out.append(f"{path}: {value} < {schema[key]}")
    if "exclusiveMinimum" in schema and _type_ok(value, "number") and value <= schema["exclusiveMinimum"]:
        out.append(f"{path}: {value} <= {schema['exclusiveMinimum']}")
    if schema.get("format") == "date-time" and isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                out.append(f"{path}: {value!r} has no time zone (RFC 3339 needs one)")
        except ValueError:
            out.append(f"{path}: {value!r} is not a date-time")
    if "anyOf" in schema:
        if not any(not errors(value, s, root, path) for s in schema["anyOf"]):
            out.append(f"{path}: matches none of anyOf: "
                       + "; ".join(e for s in schema["anyOf"] for e in errors(value, s, root, path)[:2]))
    if "oneOf" in schema:
        good = sum(1 for s in schema["oneOf"] if not errors(value, s, root, path))
        if good != 1:
            out.append(f"{path}: matches {good} of oneOf, not exactly one: "
                       + "; ".join(e for s in schema["oneOf"] for e in errors(value, s, root, path)[:2]))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                out.append(f"{path}: {key!r} is required")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += errors(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                out.append(f"{path}: {key!r} is not allowed")
            elif isinstance(extra, dict):
                out += errors(item, extra, root, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += errors(item, schema["items"], root, f"{path}[{i}]")
    return out


def validate(value: Any, schema: dict[str, Any]) -> list[str]:
    return errors(value, schema, schema)
