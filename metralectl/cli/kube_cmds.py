"""`run/ps/logs/stop --on kube[:CONTEXT]`: the CLI side of lifecycle/kube_run.py (progress on stderr, data on
stdout). Imported only when --on is given."""

from __future__ import annotations

import json
import sys
from typing import Any

from metralectl.cli.state import note
from metralectl.safetext import clean, log_line


def _client(on: str, namespace: str | None) -> tuple[Any, str]:
    from metralectl.lifecycle.kube_run import parse_on
    from metralectl.seams.kube.client import KubeClient
    from metralectl.seams.kube.config import load

    config = load(parse_on(on))
    if config.insecure and config.server.startswith("https://"):  # anyone on the way could be the cluster: say so
        note(f"warning: context {clean(config.context, 80)} skips TLS verification (insecure-skip-tls-verify): "
             "anyone between here and the cluster can read the token and answer as the API server")
    return KubeClient(config), namespace or config.namespace


def run(on: str, namespace: str | None, catalog: Any, recipe: Any, boot_timeout: float | None, as_json: bool,
        options: Any = None) -> None:
    from metralectl.lifecycle import kube_run
    from metralectl.lifecycle.kube_export import DEFAULT_FIRST_LOAD_S

    hardware = catalog.hardware.get(recipe.hardware)
    timeout = boot_timeout or (hardware.boot_timeout_s if hardware is not None else 0) or DEFAULT_FIRST_LOAD_S
    client, ns = _client(on, namespace)
    with client:
        note(clean(f"context {client.config.context}, namespace {ns}, boot timeout {timeout:.0f} s"))
        ran = kube_run.run(client, catalog, recipe, ns, timeout, lambda line: note(clean(line)), options=options)
    if as_json:
        print(json.dumps({"recipe": recipe.name, "name": ran.name, "namespace": ns, "context": ran.context,
                          "pods": ran.pods, "health": ran.health_url}, indent=2))
    else:
        print(clean(f"ready: {recipe.name} as {ns}/{ran.name} (context {ran.context}); pods: {', '.join(ran.pods)}"))


def ps(on: str, namespace: str | None, as_json: bool) -> None:
    from metralectl.lifecycle import kube_run

    client, ns = _client(on, namespace)
    with client:
        rows = kube_run.ps(client, ns)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        note(f"no metralectl pods in namespace {clean(ns)}")
        return
    print(f"{'RECIPE':<32} {'POD':<48} {'PHASE':<10} {'READY':<6} NODE")
    for row in rows:
        print(f"{clean(row['recipe'], 32):<32} {clean(row['pod'], 48):<48} {clean(row['phase'], 10):<10} "
              f"{'yes' if row['ready'] else 'no':<6} {clean(row['node'], 40)}")


def logs(on: str, namespace: str | None, recipe_name: str | None, tail: int, rank: int | None = None,
         follow: bool = False) -> None:
    """The pod's last `tail` lines; with `follow`, then each new line as the API server streams it, until the
    stream ends (the engine's container exited, or the server closed it: said on stderr)."""
    from metralectl.lifecycle import kube_run

    client, ns = _client(on, namespace)
    with client:
        if not follow:
            for line in kube_run.logs(client, ns, recipe_name, tail, rank):
                print(log_line(line, False))
            return
        pod = kube_run.log_pod(client, ns, recipe_name, rank)
        for line in client.follow_log(ns, pod, tail):
            print(log_line(line, False), flush=True)
    note(f"the log of pod {clean(pod)} ended: its engine container exited, or the API server closed the stream")


def stop(on: str, namespace: str | None, recipe_name: str | None, all_: bool, timeout_s: float = 30.0) -> None:
    """Delete the recipe's objects, then wait until their pods ended: Kubernetes' grace period (30 s) plus
    `timeout_s`."""
    from metralectl.errors import ExitCode, MetralError
    from metralectl.lifecycle import kube_run

    if recipe_name is None and not all_:
        raise MetralError("stop --on kube needs RECIPE or --all", "metralectl stop --on kube RECIPE",
                          exit_code=ExitCode.USAGE)
    client, ns = _client(on, namespace)
    with client:
        deleted = kube_run.stop(client, ns, recipe_name)
        if not deleted:
            note(f"nothing to stop in namespace {clean(ns)}")
        for line in deleted:
            print(clean(f"deleted {line}"))
        sys.stdout.flush()
        took = kube_run.wait_gone(client, ns, recipe_name, kube_run.GRACE_S + timeout_s, note)
    if deleted:
        note(f"every pod ended ({took:.1f} s)")
