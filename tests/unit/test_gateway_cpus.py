"""The gateway's CPUs of its own (`gateway --cpus`, box.yaml's `gateway-cpus`) and every engine kept off them:
the CPU list's grammar (core/cpulist.py), what seams/affinity.py lets the gateway take and leaves the engines,
box.yaml's key refused by line, and a launch's spec (lifecycle/placing.py) with its cpuset in `run --print`'s
`docker run` and outside the spec hash. A real host process on the CPUs chosen: tests/contract/test_process_runtime.py;
a real gateway on its CPUs: tests/integration/test_gateway.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from metralectl.core import cpulist
from metralectl.core.render import ContainerSpec, docker_run_command
from metralectl.seams import affinity


@pytest.mark.parametrize(("text", "cpus"), [("0", {0}), ("14-15", {14, 15}), ("0-3,8", {0, 1, 2, 3, 8}),
                                             (" 2 , 4-5 ", {2, 4, 5}), ("7-7", {7}), ("4095", {4095})])
def test_cpu_lists_read_as_linux_writes_them(text: str, cpus: set[int]) -> None:
    assert cpulist.parse(text) == frozenset(cpus)
    assert cpulist.parse(cpulist.render(cpus)) == frozenset(cpus)


def test_a_list_renders_in_its_shortest_form() -> None:
    assert cpulist.render({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert cpulist.render([5]) == "5" and cpulist.render([]) == ""


@pytest.mark.parametrize("text", ["", " ", "a", "1-", "-1", "3-1", "1,,2", "1;rm -rf /", "0x3", "1.5", "4096",
                                  "0-99999", "１", "1\n2", "\x1b[31m1", "1-2-3", "00000001"])
def test_anything_else_is_refused_with_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        cpulist.parse(text)
    said = str(refused.value)
    assert "\x1b" not in said and "\n" not in said.replace("\\n", "")  # the text quoted, never raw


@pytest.fixture()
def box_of_16(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, frozenset[int]]]]:
    """This process on a box of 16 CPUs (0-15) as seams/affinity sees it; what it sets is kept, not applied."""
    allowed = [frozenset(range(16))]
    set_calls: list[tuple[int, frozenset[int]]] = []

    def setaffinity(pid: int, cpus: Any) -> None:
        set_calls.append((pid, frozenset(cpus)))
        if pid == 0:
            allowed[0] = frozenset(cpus)

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: allowed[0], raising=False)
    monkeypatch.setattr("os.sched_setaffinity", setaffinity, raising=False)
    monkeypatch.setattr(affinity, "_before", [])
    monkeypatch.setattr(affinity, "_reserved", [])
    yield set_calls


def test_the_gateway_takes_its_cpus_and_the_engines_it_starts_get_every_other(
        box_of_16: list[tuple[int, frozenset[int]]]) -> None:
    assert affinity.for_engines() is None  # no gateway CPUs anywhere: engines as ever
    assert affinity.check(frozenset({14, 15})) is None
    affinity.pin(frozenset({14, 15}))
    assert box_of_16 == [(0, frozenset({14, 15}))]
    # a load the pinned gateway starts must not inherit its two CPUs: every CPU the process had, less those
    assert affinity.for_engines() == tuple(range(14))
    assert affinity.for_engines(frozenset({0})) == tuple(range(1, 14))  # and box.yaml's, if it names others
    affinity.apply(4242, affinity.for_engines())
    assert box_of_16[-1] == (4242, frozenset(range(14)))
    affinity.apply(4243, None)
    assert box_of_16[-1][0] == 4242  # None: nothing set


def test_cpus_this_process_may_not_use_or_all_of_them_are_refused(box_of_16: Any) -> None:
    assert "CPU 16-17 is not one this process may use (it may use 0-15)" in str(affinity.check(frozenset({15, 16, 17})))
    assert "none would be left for engines" in str(affinity.check(frozenset(range(16))))
    assert affinity.for_engines(frozenset({99})) is None  # none of them here: nothing kept off
    assert affinity.for_engines(frozenset(range(16))) is None  # all of them: engines are never left without a CPU


def _box_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "box.yaml").write_text(text)
    monkeypatch.setenv("METRALECTL_CONFIG_DIR", str(config))


def test_box_yaml_names_the_gateways_cpus_and_a_wrong_list_is_refused_by_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.errors import RecipeInvalid
    from metralectl.lifecycle.budget import box_config

    _box_yaml(tmp_path, monkeypatch, 'budget: 24\ngateway-cpus: "14-15"\n')
    assert box_config().gateway_cpus == frozenset({14, 15})
    _box_yaml(tmp_path, monkeypatch, "gateway-cpus: 7\n")
    assert box_config().gateway_cpus == frozenset({7})
    for bad, said in (('gateway-cpus: "15-14"\n', "a range runs from the lower CPU"),
                      ('gateway-cpus: "two"\n', "is not a CPU or a range"), ("gateway-cpus: [1, 2]\n", "a CPU list"),
                      ("gateway-cpus: true\n", "a CPU list")):
        _box_yaml(tmp_path, monkeypatch, "budget: 24\n" + bad)
        with pytest.raises(RecipeInvalid) as refused:
            box_config()
        text = "\n".join(p.render() if hasattr(p, "render") else str(p) for p in refused.value.problems)
        assert said in text and "box.yaml" in text and ":2" in text, text  # the file and its line


def test_every_launch_is_kept_off_the_gateways_cpus_outside_its_spec_hash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, box_of_16: Any) -> None:
    from metralectl.lifecycle.placing import off_gateway_cpus

    spec = ContainerSpec(name="qwen", image="example/engine:1", command=("serve",), gpus=1)
    _box_yaml(tmp_path, monkeypatch, "budget: 24\n")
    assert off_gateway_cpus(spec) is spec  # nothing named: as ever
    _box_yaml(tmp_path, monkeypatch, 'gateway-cpus: "14-15"\n')
    kept = off_gateway_cpus(spec)
    assert kept.cpu_ids == tuple(range(14)) and kept.spec_hash() == spec.spec_hash()
    assert "--cpuset-cpus 0-13" in docker_run_command(kept) and "--cpuset-cpus" not in docker_run_command(spec)
    assert off_gateway_cpus(replace(spec, cpu_ids=(3,))).cpu_ids == (3,)  # chosen already: kept
