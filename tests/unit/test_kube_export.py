"""`export kube|compose`: golden manifests, each rank's argv held to `run --print --rank N` byte for byte, and every
shipped recipe's manifests validated against real schemas (Kubernetes' OpenAPI of a pinned version, through the
kubernetes-validate package; LeaderWorkerSet's CRD pinned from kubernetes-sigs/lws with its sha256). No cluster."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from metralectl.cli.main import cli
from metralectl.errors import ExitCode
from metralectl.lifecycle.kube_export import (LEADER_ADDRESS, WORKER_INDEX, KubeOptions, compose_file, dns_label,
                                              dump, kube_manifests, label_value)
from tests.unit.recipe_helpers import REPO, catalog

K8S_VERSION = "1.33.0"  # the pinned Kubernetes whose OpenAPI schemas the manifests must satisfy (strict)
KUBE = REPO / "tests" / "kube"
LWS_CRD = KUBE / "lws-crd-v0.10.0.yaml"
LWS_SOURCE = json.loads((KUBE / "lws-crd-v0.10.0.source.json").read_text())
EP2 = "qwen3.5-122b-a10b-ep2"
SINGLE = "qwen3.5-35b-a3b"  # the flagship (tests/golden/flagship-docker-run.txt)
GOLDEN_SINGLE = REPO / "tests" / "golden" / "kube-flagship.yaml"
GOLDEN_EP2 = REPO / "tests" / "golden" / "kube-ep2.yaml"
ROCE = ("--roce-interface", "enp1s0f0np0", "--rdma-device", "rocep1s0f0")
HEAD_IP = "10.0.0.1"


@pytest.fixture()
def operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the Docker goldens: the HF cache at ~/.cache/huggingface of /home/operator, owner `operator`."""
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _docs(text: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(text))


def _container(pod_template: dict[str, Any]) -> dict[str, Any]:
    [container] = pod_template["spec"]["containers"]
    return container


def _cat():  # type: ignore[no-untyped-def]
    return catalog()


def _options(recipe: Any) -> KubeOptions:
    return KubeOptions(roce_interface="enp1s0f0np0", rdma_device="rocep1s0f0") if recipe.multi_rank else KubeOptions()


# --- golden -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "golden"), [((SINGLE,), GOLDEN_SINGLE), ((EP2, *ROCE), GOLDEN_EP2)])
def test_golden_manifests(operator: None, args: tuple[str, ...], golden: Path) -> None:
    """What an operator applies (regenerate deliberately: METRALECTL_REGEN_GOLDEN=1)."""
    text = _invoke("export", "kube", *args)
    import os

    if os.environ.get("METRALECTL_REGEN_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


# --- parity with `run --print --rank N` ----------------------------------------------------------------------------
def _expand(words: list[str], rank: int) -> list[str]:
    """Kubernetes' own expansion of `args`: $(VAR) from the pod's environment, `$$(` to a literal `$(`."""
    out = []
    for word in words:
        word = word.replace(LEADER_ADDRESS, HEAD_IP).replace(WORKER_INDEX, str(rank))
        out.append(word.replace("$$(", "$("))
    return out


@pytest.mark.parametrize("name", sorted(r for r, rec in catalog().recipes.items() if rec.multi_rank))
def test_each_ranks_argv_is_run_print_rank_n_byte_for_byte(operator: None, name: str) -> None:
    docs = _docs(_invoke("export", "kube", name, *ROCE))
    template = docs[0]["spec"]["leaderWorkerTemplate"]
    assert template["size"] == catalog().recipes[name].resources.world_size
    for rank in range(template["size"]):
        pod = template["leaderTemplate"] if rank == 0 else template["workerTemplate"]
        printed = json.loads(_invoke("run", name, "--print", "--json", "--rank", str(rank), "--master-addr", HEAD_IP,
                                     *ROCE))
        container = _container(pod)
        assert json.dumps(_expand(container["args"], rank)) == json.dumps(printed["command"])
        assert {e["name"]: e["value"] for e in container["env"]} == printed["env"]
        assert container["image"] == printed["image"]
        # and the `docker run` text an operator pastes ends with those very words, after the image
        text = _invoke("run", name, "--print", "--rank", str(rank), "--master-addr", HEAD_IP, *ROCE)
        words = shlex.split(text.replace(" \\\n", " "))  # the line continuations a shell drops
        assert words[words.index(printed["image"]) + 1:] == _expand(container["args"], rank)


def test_single_rank_argv_is_run_prints(operator: None) -> None:
    docs = _docs(_invoke("export", "kube", SINGLE))
    printed = json.loads(_invoke("run", SINGLE, "--print", "--json"))
    container = _container(docs[0]["spec"]["template"])
    assert json.dumps(_expand(container["args"], 0)) == json.dumps(printed["command"])
    assert docs[0]["spec"]["template"]["metadata"]["labels"]["ai.metrale.metralectl.spec-hash"] == \
        printed["labels"]["ai.metrale.metralectl.spec-hash"]


def test_a_pod_of_gpus_all_asks_the_gpus_its_engine_spreads_the_model_over(operator: None) -> None:
    """A pod asks a count of nvidia.com/gpu, never "all": a vLLM recipe told tensor-parallel-size 4 asks 4 (vLLM
    would not start on the one a pod got before), one of tensor × pipeline 2 × 2 asks 4, and --gpus still wins."""
    def limit(*args: str) -> int:
        container = _container(_docs(_invoke("export", "kube", "qwen3.6-35b-a3b-vllm", *args))[0]["spec"]["template"])
        return container["resources"]["limits"]["nvidia.com/gpu"]

    assert limit() == 1
    assert limit("--set", "serve.tensor-parallel-size=4") == 4
    assert limit("--set", "serve.tensor-parallel-size=2", "--set", "serve.pipeline-parallel-size=2") == 4
    assert limit("--set", "serve.tensor-parallel-size=4", "--gpus", "8") == 8


def test_a_literal_dollar_paren_in_a_recipe_stays_literal(operator: None) -> None:
    from metralectl.lifecycle.kube_export import _kube_text

    assert _kube_text("$(HOME)x") == "$$(HOME)x"
    assert _kube_text(f"{LEADER_ADDRESS}:29500") == f"{LEADER_ADDRESS}:29500"
    assert _expand([_kube_text("a$(B)")], 0) == ["a$(B)"]


# --- the EP=2 profile -----------------------------------------------------------------------------------------------
def test_ep2_pods_carry_the_profile(operator: None) -> None:
    lws, service = _docs(_invoke("export", "kube", EP2, *ROCE))
    for pod in (lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"],
                lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]):
        spec, container = pod["spec"], _container(pod)
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["rdma"]["hostPath"]["path"] == "/dev/infiniband"
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        assert volumes["hf-cache"]["hostPath"]["path"] == "/home/operator/.cache/huggingface"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0" and env["NCCL_IB_HCA"] == "rocep1s0f0"
        assert env["NCCL_NVLS_ENABLE"] == "0"
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    no_rdma = _docs(_invoke("export", "kube", EP2, "--roce-interface", "enp1s0f0np0", "--no-rdma"))[0]
    pod = no_rdma["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "securityContext" not in _container(pod)
    assert all(v["name"] != "rdma" for v in pod["spec"]["volumes"])


def test_the_head_has_probes_from_the_engine_file_and_a_startup_long_enough_for_a_first_load(operator: None) -> None:
    cat = _cat()
    deployment = kube_manifests(cat, cat.recipes[SINGLE], KubeOptions())[0]
    container = _container(deployment["spec"]["template"])
    startup, ready = container["startupProbe"], container["readinessProbe"]
    assert startup["httpGet"]["path"] == cat.engines["metrale"].readiness.health_path == ready["httpGet"]["path"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= cat.hardware["gb10"].boot_timeout_s
    assert startup["httpGet"]["host"] == "127.0.0.1"  # the recipe binds loopback; host network: the node's


def test_multi_rank_needs_the_roce_interface_and_compose_refuses_it() -> None:
    env_run = [sys.executable, "-m", "metralectl", "export"]
    out = subprocess.run([*env_run, "kube", EP2], capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.USAGE and "--roce-interface" in out.stderr
    out = subprocess.run([*env_run, "compose", EP2], capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.USAGE and "export kube" in out.stderr


def test_names_follow_kubernetes_grammar() -> None:
    assert dns_label("metralectl-demo") == "metralectl-demo"
    escaped = dns_label("metralectl-qwen3.5-35b")
    assert escaped.startswith("metralectl-qwen3-5-35b-") and escaped != dns_label("metralectl-qwen3-5-35b")
    assert len(dns_label("x" * 100)) == 63 and dns_label("9abc")[0].isalpha()
    assert len(dns_label("a" * 80, 48)) == 48
    assert label_value("qwen3.5-35b") == "qwen3.5-35b"
    import re

    for text in ("DOMAIN\\user name", "-lead", "x" * 70, "é"):
        assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", label_value(text))
        assert len(label_value(text)) <= 63


# --- schemas --------------------------------------------------------------------------------------------------------
def test_the_pinned_lws_crd_is_the_one_recorded() -> None:
    assert hashlib.sha256(LWS_CRD.read_bytes()).hexdigest() == LWS_SOURCE["sha256"]
    assert LWS_SOURCE["repository"] == "https://github.com/kubernetes-sigs/lws"
    assert len(LWS_SOURCE["commit"]) == 40


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses unknown fields (the API server prunes them silently:
    a misspelt field would be dropped, not refused) and knows Kubernetes' int-or-string."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema and "additionalProperties" not in schema and \
            not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=1)
def _lws_validator():  # type: ignore[no-untyped-def]
    import jsonschema

    crd = yaml.safe_load(LWS_CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by Kubernetes' schema below
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("name", sorted(catalog().recipes))
def test_every_shipped_recipes_manifests_validate(operator: None, name: str) -> None:
    import kubernetes_validate

    cat = _cat()
    recipe = cat.recipes[name]
    if recipe.runtime == "process":
        pytest.skip("a host-process recipe has no container to export")
    if recipe.engine_config:
        pytest.skip("an engine-config file is not exported yet (tests/unit/test_trtllm.py: the refusal)")
    docs = _docs(dump(kube_manifests(cat, recipe, _options(recipe))))
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            errors = sorted(_lws_validator().iter_errors(doc), key=str)
            assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
            template = doc["spec"]["leaderWorkerTemplate"]
            for pod in (template["leaderTemplate"], template["workerTemplate"]):  # the pods, against core/v1
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **pod[
                    "metadata"]}, "spec": pod["spec"]}, K8S_VERSION, strict=True)
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                         K8S_VERSION, strict=True)  # its ObjectMeta
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if not recipe.multi_rank:
        compose = yaml.safe_load(dump([compose_file(cat, recipe)]))
        assert list(compose["services"].values())[0]["command"][0] == recipe_first_word(cat, recipe)


def recipe_first_word(cat: Any, recipe: Any) -> str:
    from metralectl.core.render import spec_for

    return spec_for(cat, recipe).command[0]


def test_the_validators_refuse_a_broken_manifest(operator: None) -> None:
    """The schemas bite: a misspelt field, a wrong type."""
    import kubernetes_validate

    cat = _cat()
    deployment = kube_manifests(cat, cat.recipes[SINGLE], KubeOptions())[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    lws = kube_manifests(cat, cat.recipes[EP2], KubeOptions(roce_interface="enp1s0f0np0"))[0]
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    assert len(list(_lws_validator().iter_errors(lws))) == 2


def test_the_runtime_needs_no_schema_package() -> None:
    """kubernetes-validate is a test extra: nothing metralectl ships imports it."""
    package = REPO / "metralectl"
    assert not [p for p in package.rglob("*.py") if "kubernetes_validate" in p.read_text()]


def test_more_than_two_ranks_read_their_rank_from_lws_and_other_differences_are_refused() -> None:
    from dataclasses import replace

    from metralectl.core.render import ContainerSpec
    from metralectl.errors import MetralError
    from metralectl.lifecycle.kube_export import worker_argv

    def spec(rank: int, port: str = "8888") -> ContainerSpec:
        return ContainerSpec(name=f"r{rank}", image="i", command=("serve", "m", "--rank", str(rank), "--world-size",
                                                                  "3", "--master-addr", LEADER_ADDRESS, "--port", port))

    assert worker_argv([spec(0), spec(1), spec(2)]) == ["serve", "m", "--rank", WORKER_INDEX, "--world-size", "3",
                                                        "--master-addr", LEADER_ADDRESS, "--port", "8888"]
    assert worker_argv([spec(0), spec(1)])[3] == "1"
    with pytest.raises(MetralError, match="differs from rank 1") as refused:
        worker_argv([spec(0), spec(1), replace(spec(2), command=spec(2, "8889").command)])
    assert refused.value.exit_code == ExitCode.DATA


def test_a_namespace_outside_the_grammar_is_a_usage_error() -> None:
    from metralectl.errors import MetralError

    cat = _cat()
    for bad in ("LLM", "-x", "a_b", "x" * 64):
        with pytest.raises(MetralError) as refused:
            kube_manifests(cat, cat.recipes[SINGLE], KubeOptions(namespace=bad))
        assert refused.value.exit_code == ExitCode.USAGE
    assert kube_manifests(cat, cat.recipes[SINGLE], KubeOptions(namespace="0llm"))[0]["metadata"]["namespace"] == "0llm"
