"""`bench run --self-start RECIPE`: serve the recipe through the lifecycle, hand over the endpoint, and
tear it down afterwards — after a failure or Ctrl-C too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from metralectl.bench.runner import Event


@contextmanager
def served(recipe_name: str, progress: Any) -> Iterator[tuple[str, dict[str, Any], Any]]:
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.cli.serve_cmds import _Progress as LifecycleProgress
    from metralectl.lifecycle.launch import LaunchOptions, launch
    from metralectl.lifecycle.stop import stop_containers
    from metralectl.core.labels import LABEL_SPEC_HASH
    from metralectl.seams.docker_runtime import open_runtime
    from metralectl.seams.store import lifecycle_lock

    catalog = _catalog()
    recipe = catalog.recipe(recipe_name)
    with open_runtime() as runtime:
        with lifecycle_lock(f"bench --self-start {recipe.name}"):
            launched = launch(recipe, catalog, runtime, options=LaunchOptions(), on_event=LifecycleProgress(False))
        info = runtime.inspect(launched.container_id)
        try:
            revision = runtime.image_state(info.image).revision if info else None
            managed = {"recipe": recipe.name, "spec_hash": info.labels.get(LABEL_SPEC_HASH) if info else None,
                       "image": info.image if info else None, "image_revision": revision,
                       "container": launched.container, "url": launched.url}
            yield launched.url, managed, recipe
        finally:
            progress(Event("note", f"stopping {launched.container} (self-started)"))
            current = runtime.inspect(launched.container_id)
            if current is not None:
                with lifecycle_lock(f"bench teardown {recipe.name}"):
                    stop_containers(runtime, [current], on_event=LifecycleProgress(False))
