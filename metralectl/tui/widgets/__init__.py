"""Leaf widgets: they get data through methods/attributes and post intent messages; no core calls."""
