"""The four views (one per tab). Each owns its workers; widgets below them only show and ask."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from textual.dom import DOMNode

    from metralectl.tui.services import Services


def services_of(node: DOMNode) -> Services:
    return cast("Services", node.app.services)  # type: ignore[attr-defined]
