"""Engines as plugins: an engine is its pinned data (engine/<name>.yaml, flags and revisions checked against the
engine's own option dump) plus one Python class for what differs in code (base.Engine).

Built-in engines register through the entry-point group `metralectl.engines`, the same way a third party's
package would (pyproject.toml); registry.py discovers them lazily, on the first question about an engine,
never at `--help` or `list`. This package's __init__ imports nothing, so naming it costs nothing.
"""
