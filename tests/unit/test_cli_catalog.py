"""The CLI over the catalog, run as a real subprocess: exit codes, stdout data, stderr diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.errors import ExitCode

from tests.unit.recipe_helpers import REPO, flagship_data, write

HEAVY = ("docker", "textual", "httpx", "huggingface_hub", "pynvml")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO, timeout=60)


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["list", "--json"], ["show", "qwen3.5-35b-a3b"],
                                  ["run", "qwen3.5-35b-a3b", "--print"], ["recipes", "check"]])
def test_light_commands_import_nothing_heavy(argv: list[str]) -> None:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{argv!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "HEAVY=\n" in out.stderr or out.stderr.rstrip().endswith("HEAVY="), out.stderr


def test_list_table_and_json() -> None:
    table = cli("list")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:5] == ["RECIPE", "ENGINE", "MODEL", "QUANT", "HW"]
    assert "qwen3.5-35b-a3b" in table.stdout and "fit judged on" in table.stderr
    data = json.loads(cli("list", "--json").stdout)
    flagship = next(r for r in data["recipes"] if r["name"] == "qwen3.5-35b-a3b")
    assert flagship["mtp"] is True and flagship["validated_tok_s"] == 133 and flagship["weights"] == "absent"
    assert flagship["source"] == "shipped" and flagship["nodes"] == 1
    if not Path("/proc/driver/nvidia/gpus").exists():  # this box has no NVIDIA GPU: a gb10 recipe cannot run on it
        assert flagship["fits"] is False and "no NVIDIA GPU" in flagship["fits_reason"], flagship
    on_gb10 = {r["name"]: r for r in json.loads(cli("list", "--json", "--hardware", "gb10").stdout)["recipes"]}
    assert on_gb10["qwen3.5-35b-a3b"]["fits"] is True and "GB" in on_gb10["qwen3.5-35b-a3b"]["fits_reason"]


def test_list_judges_nodes_on_one_box() -> None:
    """An EP=2 recipe needs two machines: on one box FITS says no, with the reason, even where its memory fits."""
    table = cli("list", "--hardware", "gb10")
    header = table.stdout.splitlines()[0].replace("MEM GB", "MEM_GB").split()
    assert "NODES" in header and "FITS" in header
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert rows["qwen3.5-122b-a10b-ep2"][header.index("NODES")] == "2"
    assert rows["qwen3.5-122b-a10b-ep2"][header.index("FITS")].rstrip("¹²³⁴⁵⁶⁷⁸⁹⁰") == "no"
    assert rows["qwen3.5-122b-a10b-single"][header.index("NODES")] == "1"
    assert rows["qwen3.5-122b-a10b-single"][header.index("FITS")] == "yes"
    data = {r["name"]: r for r in json.loads(cli("list", "--json", "--hardware", "gb10").stdout)["recipes"]}
    ep2 = data["qwen3.5-122b-a10b-ep2"]
    assert ep2["nodes"] == 2 and ep2["fits"] is False and "needs 2 nodes" in ep2["fits_reason"]
    assert ep2["memory_gb"] is not None  # the memory is still estimated (per rank); the nodes rule it out
    # a class mismatch and the nodes are both named
    hopper = {r["name"]: r for r in json.loads(cli("list", "--json", "--hardware", "hopper").stdout)["recipes"]}
    assert "needs 2 nodes" in hopper["qwen3.5-122b-a10b-ep2"]["fits_reason"]
    assert "built for gb10, this is hopper" in hopper["qwen3.5-122b-a10b-ep2"]["fits_reason"]


def test_list_filters() -> None:
    data = json.loads(cli("list", "--json", "--tag", "ep2").stdout)
    assert data["recipes"] and all("ep2" in r["tags"] for r in data["recipes"])
    hopper = json.loads(cli("list", "--json", "--hardware", "hopper").stdout)
    by_name = {r["name"]: r for r in hopper["recipes"]}
    assert by_name["qwen3.5-35b-a3b"]["fits"] is False and "built for gb10" in by_name["qwen3.5-35b-a3b"]["fits_reason"]
    assert by_name["qwen3.5-35b-a3b-hopper"]["fits"] is True
    only = json.loads(cli("list", "--json", "--hardware", "hopper", "--only").stdout)
    assert {r["hardware"] for r in only["recipes"]} == {"hopper"}


def test_unknown_hardware_is_a_clear_error() -> None:
    out = cli("list", "--hardware", "gb1O")
    assert out.returncode == ExitCode.USAGE and "unknown hardware class 'gb1O'" in out.stderr and "did you mean `gb10`" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_show_has_provenance_memory_breakdown_and_command() -> None:
    out = cli("show", "qwen3.5-35b-a3b")
    assert out.returncode == 0, out.stderr
    for fragment in ("Provenance", "recipes/qwen3.5-35b-a3b.yaml", "133 tok/s", "Memory estimate", "weights",
                     "KV pool", "8192 seq × 2 batch × 10 attn layers", "budget", "119.7 GB unified × 0.85",
                     "engine recipe Metrale/metrale-inference recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml @ 2735884",
                     "targets       engine revision 2735884",
                     "docker run -d --name metralectl-qwen3.5-35b-a3b"):
        assert fragment in out.stdout, fragment
    data = json.loads(cli("show", "qwen3.5-35b-a3b", "--json").stdout)
    assert data["memory"]["fits"] is True and data["commands"][0].startswith("docker run")


def test_unknown_recipe_suggests() -> None:
    out = cli("show", "qwen3.5-35b-a3")
    assert out.returncode == ExitCode.USAGE and "no recipe named 'qwen3.5-35b-a3'" in out.stderr and "did you mean" in out.stderr


def test_run_print_with_set_shows_deviation() -> None:
    out = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "max-seq-len=4096", "--set", "resources.port=9000")
    assert out.returncode == 0, out.stderr
    assert "--max-seq-len 4096" in out.stdout and "--port 9000" in out.stdout
    assert "deviation from the validated recipe: serve.max-seq-len: 8192 -> 4096" in out.stderr
    assert "resources.port: 8888 -> 9000" in out.stderr


def test_run_print_set_goes_through_the_checker() -> None:
    out = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "enable-prefix-caching=maybe")
    assert out.returncode == ExitCode.USAGE and out.stdout == ""  # the recipe is fine: the --set made it invalid
    assert "--set enable-prefix-caching=maybe" in out.stderr and "presence-only switch" in out.stderr
    off = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "enable-prefix-caching=false")
    assert off.returncode == 0 and "--enable-prefix-caching" not in off.stdout  # `false` = the flag's absence
    assert "serve.enable-prefix-caching: True -> False" in off.stderr
    out = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "max-seq-lenn=4096")
    assert out.returncode == ExitCode.USAGE and "not a serve flag" in out.stderr
    out = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "resources.port=70000")
    assert out.returncode == ExitCode.USAGE and "between 1 and 65535" in out.stderr and "Traceback" not in out.stderr


def test_run_print_json_spec() -> None:
    spec = json.loads(cli("run", "qwen3.5-35b-a3b", "--print", "--json").stdout)
    assert spec["network_mode"] == "host" and spec["gpus"] == "all" and spec["command"][0] == "serve"


def test_recipes_check_files(tmp_path: Path) -> None:
    good = write(tmp_path, flagship_data(), "good.yaml")
    bad_data = flagship_data()
    bad_data["serve"]["speculatve"] = True
    bad = write(tmp_path, bad_data, "bad.yaml")
    ok = cli("recipes", "check", str(good))
    assert ok.returncode == 0 and "ok" in ok.stdout
    refused = cli("recipes", "check", str(good), str(bad))
    assert refused.returncode == ExitCode.DATA
    assert f"{bad}:" in refused.stderr and "did you mean `speculative`" in refused.stderr
    assert "REFUSED" in refused.stdout and "Traceback" not in refused.stderr
    data = json.loads(cli("recipes", "check", "--json", str(bad)).stdout)
    assert data[0]["ok"] is False and data[0]["problems"][0]["line"] > 0


def test_recipes_check_all_shipped() -> None:
    out = cli("recipes", "check")
    assert out.returncode == 0, out.stderr
    assert "0 refused" in out.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    out = cli("recipes", "check", str(tmp_path / "nope.yaml"))
    assert out.returncode == ExitCode.DATA and "cannot read the file" in out.stderr and "Traceback" not in out.stderr


def test_user_recipes_extend_and_override(isolated_env: Path) -> None:
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    override = flagship_data()
    override["serve"]["max-seq-len"] = 16384
    write(user, override, "qwen3.5-35b-a3b.yaml")
    (user / "my-35b.yaml").write_text("extends: qwen3.5-35b-a3b\nname: my-35b\ndescription: mine\n"
                                      "serve:\n  max-batch-size: 2\nresources:\n  port: 9001\n")
    env = {"METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    data = {r["name"]: r for r in json.loads(cli("list", "--json", env=env).stdout)["recipes"]}
    assert data["qwen3.5-35b-a3b"]["source"] == "user" and data["qwen3.5-35b-a3b"]["overrides"]
    assert data["my-35b"]["source"] == "user"
    printed = cli("run", "my-35b", "--print", env=env).stdout
    assert "--max-batch-size 2" in printed and "--port 9001" in printed and "--max-seq-len 16384" in printed
    assert "user (overrides shipped)" in cli("list", env=env).stdout


def test_broken_user_recipe_is_reported_and_others_still_list(isolated_env: Path) -> None:
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "broken.yaml").write_text("extends: qwen3.5-35b-a3b\nname: broken\nserve:\n  max-seq-len: lots\n")
    env = {"METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    out = cli("list", env=env)
    assert out.returncode == ExitCode.DATA
    assert "qwen3.5-35b-a3b" in out.stdout
    assert f"{user / 'broken.yaml'}:4:3: error: serve.max-seq-len: --max-seq-len must be an integer" in out.stderr
    shown = cli("show", "broken", env=env)
    assert shown.returncode == ExitCode.DATA and "must be an integer" in shown.stderr


def test_debug_shows_traceback_only_when_asked(tmp_path: Path) -> None:
    out = cli("--debug", "show", "nope")
    assert out.returncode == ExitCode.USAGE and "Traceback" not in out.stderr  # a MetralError is not a crash


def test_ctrl_c_says_interrupted_and_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C inside a command, a plain Click one (`list`) or one Typer built (`show`): one line, exit 130."""
    from metralectl.cli import catalog_list
    from metralectl.cli import main as cli_main
    from metralectl.present import show_view

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog_list, "list_recipes", interrupted)
    monkeypatch.setattr(show_view, "as_text", interrupted)
    for argv in (["list"], ["show", "demo-cpu"]):
        with pytest.raises(SystemExit) as exited:
            cli_main.main(argv)
        assert exited.value.code == 130 and capsys.readouterr().err == "metralectl: interrupted\n", argv
