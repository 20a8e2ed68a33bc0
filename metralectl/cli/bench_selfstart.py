"""`bench run --self-start RECIPE`: serve the recipe through the use-case layer (the same run and stop as
`metralectl run` / `stop`: catalog, lock, repair, preflight), hand over the endpoint, and tear it down
afterwards — after a failure or Ctrl-C too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from metralectl.bench.runner import Event


@contextmanager
def served(recipe_name: str, progress: Any) -> Iterator[tuple[str, dict[str, Any], Any]]:
    from metralectl.app.serving import Change, Serving
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.cli.serve_cmds import _Progress as LifecycleProgress
    from metralectl.core.labels import LABEL_SPEC_HASH
    from metralectl.lifecycle.launch import Launched

    serving = Serving(catalog=_catalog, lock_note="(bench --self-start)")
    recipe = serving.resolve(Change.run(recipe_name))
    launched = serving.run(Change.run(recipe_name), LifecycleProgress(False))
    assert isinstance(launched, Launched)  # --self-start takes single-node recipes (a multi-rank one is refused)
    try:
        with serving.runtime() as runtime:
            info = runtime.inspect(launched.container_id)
            revision = runtime.image_state(info.image).revision if info else None
        managed = {"recipe": recipe.name, "spec_hash": info.labels.get(LABEL_SPEC_HASH) if info else None,
                   "image": info.image if info else None, "image_revision": revision,
                   "container": launched.container, "url": launched.url, "labels": dict(info.labels) if info else {}}
        yield launched.url, managed, recipe
    finally:
        progress(Event("note", f"stopping {launched.container} (self-started)"))
        serving.stop(Change.stop(recipe.name), LifecycleProgress(False))
