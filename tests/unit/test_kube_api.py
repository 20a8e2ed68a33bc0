"""`run/ps/logs/stop --on kube` against a recorded-request fake of the Kubernetes API server (tests/fakes/kube_api.py):
a real HTTP server on loopback, the real CLI in a subprocess. No live cluster (issue 33: the API path is tested
in unit tests only)."""

from __future__ import annotations

import base64
import os
import signal
import ssl
import subprocess
import time
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fakes.kube_api import FakeKube

RECIPE = "qwen3.5-35b-a3b"
SETS = ["--set", "resources.bind=0.0.0.0", "--set", "resources.expose-acknowledged=true"]
NAME = "metralectl-qwen3-5-35b-a3b-71091b"
TOKEN = "s3cret-token"


def _kubeconfig(path: Path, server: str, *, user: dict | None = None, cluster: dict | None = None) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "lab",
           "clusters": [{"name": "lab", "cluster": {"server": server, **(cluster or {})}},
                        {"name": "other", "cluster": {"server": "http://127.0.0.1:9"}}],
           "users": [{"name": "me", "user": user if user is not None else {"token": TOKEN}}],
           "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me", "namespace": "llm"}},
                        {"name": "spare", "context": {"cluster": "other", "user": "me"}}]}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture()
def fake() -> Iterator[FakeKube]:
    server = FakeKube()
    yield server
    server.stop()


def _env(tmp_path: Path, kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path / "home"), "NO_COLOR": "1",
            "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _cli(tmp_path: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env=_env(tmp_path, kubeconfig), timeout=120)


def _calls(fake: FakeKube) -> list[str]:
    return [f"{r.method} {r.path}" for r in fake.requests]


def test_run_applies_exports_objects_then_waits_ready_then_health(tmp_path: Path, fake: FakeKube) -> None:
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube")
    assert ran.returncode == 0, ran.stderr
    exported = _cli(tmp_path, config, "export", "kube", RECIPE, *SETS, "-n", "llm")
    assert exported.returncode == 0, exported.stderr
    objects = list(yaml.safe_load_all(exported.stdout))
    applies = [r for r in fake.requests if r.method == "PATCH"]
    assert [r.json for r in applies] == objects  # exactly `export kube`'s objects, in its order
    assert [r.path for r in applies] == [f"/apis/apps/v1/namespaces/llm/deployments/{NAME}",
                                         f"/api/v1/namespaces/llm/services/{NAME}"]
    for r in applies:
        assert r.query == {"fieldManager": "metralectl", "force": "true"}
        assert r.headers["content-type"] == "application/apply-patch+yaml"
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in fake.requests)
    calls = _calls(fake)
    pods_at = calls.index("GET /api/v1/namespaces/llm/pods")
    port = objects[1]["spec"]["ports"][0]["port"]
    health_at = calls.index(f"GET /api/v1/namespaces/llm/services/{NAME}:{port}/proxy/health")
    assert calls.index(f"PATCH /api/v1/namespaces/llm/services/{NAME}") < pods_at < health_at == len(calls) - 1
    assert fake.requests[pods_at].query["labelSelector"] == f"app.kubernetes.io/instance={NAME}"
    assert "pods ready: 1 of 1" in ran.stderr and f"llm/{NAME}" in ran.stdout
    assert not any(r.method == "DELETE" for r in fake.requests)


def test_a_multi_rank_recipe_applies_exports_leaderworkerset_and_waits_for_both_ranks(tmp_path: Path,
                                                                                     fake: FakeKube) -> None:
    fake.lws_installed = True
    config = _kubeconfig(tmp_path / "kc", fake.start())
    args = ["qwen3.5-122b-a10b-ep2", *SETS, "--roce-interface", "enp1s0f0np0"]
    ran = _cli(tmp_path, config, "run", *args, "--on", "kube")
    assert ran.returncode == 0, ran.stderr
    exported = _cli(tmp_path, config, "export", "kube", *args, "-n", "llm")
    objects = list(yaml.safe_load_all(exported.stdout))
    assert [r.json for r in fake.requests if r.method == "PATCH"] == objects
    assert [o["kind"] for o in objects] == ["LeaderWorkerSet", "Service"]
    assert "pods ready: 2 of 2" in ran.stderr
    name = objects[0]["metadata"]["name"]
    assert f"pods: {name}-0, {name}-0-1" in ran.stdout
    assert _cli(tmp_path, config, "run", *args, "--on", "kube", "--worker", "ssh://b").returncode == 64
    # each rank's log: the pod LWS labels with that worker index (the head's by default); a rank it lacks, named
    for rank, pod in ((None, f"{name}-0"), (0, f"{name}-0"), (1, f"{name}-0-1")):
        logs = _cli(tmp_path, config, "logs", "qwen3.5-122b-a10b-ep2", "--on", "kube",
                    *(["--rank", str(rank)] if rank is not None else []))
        assert logs.returncode == 0, logs.stderr
        assert [r for r in fake.requests if r.path.endswith("/log")][-1].path.endswith(f"/pods/{pod}/log"), rank
    missing = _cli(tmp_path, config, "logs", "qwen3.5-122b-a10b-ep2", "--on", "kube", "--rank", "2")
    assert missing.returncode == 1 and "no pod of rank 2" in missing.stderr and "ranks there: 0, 1" in missing.stderr


def test_a_pod_that_cannot_start_is_deleted_and_says_why_escaped(tmp_path: Path, fake: FakeKube) -> None:
    fake.pods = "stuck"
    fake.event = "pull access denied \x1b[2J"
    fake.log = "boot \x1b]52;c;aGk=\x07 failed\n"
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube")
    assert ran.returncode == 1, ran.stderr
    assert "ImagePullBackOff" in ran.stderr and "pull access denied \\x1b[2J" in ran.stderr
    assert "boot \\x1b]52;c;aGk=\\x07 failed" in ran.stderr
    assert "\x1b" not in ran.stderr.replace("\x1b[0m", "").replace("\x1b[31m", "").replace("\x1b[1m", "")
    calls = _calls(fake)
    deletes = [c for c in calls if c.startswith("DELETE")]
    assert deletes == [f"DELETE /api/v1/namespaces/llm/services/{NAME}",
                       f"DELETE /apis/apps/v1/namespaces/llm/deployments/{NAME}"]  # reverse order of the applies
    assert calls.index(deletes[0]) > max(i for i, c in enumerate(calls) if c.startswith("PATCH"))
    assert fake.objects == {}  # nothing left applied
    assert "Traceback" not in ran.stderr


def test_the_boot_timeout_deletes_what_was_applied(tmp_path: Path, fake: FakeKube) -> None:
    fake.pods = "never"
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube", "--boot-timeout", "1")
    assert ran.returncode == 1 and "0 of 1 pods ready when the boot timeout ran out" in ran.stderr
    assert fake.objects == {} and any(c.startswith("DELETE") for c in _calls(fake))


def test_ctrl_c_while_waiting_deletes_what_was_applied(tmp_path: Path, fake: FakeKube) -> None:
    fake.pods = "never"
    config = _kubeconfig(tmp_path / "kc", fake.start())
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "run", RECIPE, *SETS, "--on", "kube", "-n", "team"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, config))
    deadline = time.monotonic() + 60
    while not any(r.path == "/api/v1/namespaces/team/pods" for r in fake.requests):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert fake.objects == {} and "deleted Deployment team/" in err
    assert {r.path.split("/namespaces/")[1].split("/")[0] for r in fake.requests} == {"team"}  # -n over the context's namespace


def test_health_never_answering_through_the_service_fails_and_cleans_up(tmp_path: Path, fake: FakeKube) -> None:
    fake.health = 503
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube", "--boot-timeout", "1")
    assert ran.returncode == 1 and "answered 503" in ran.stderr
    assert fake.objects == {}


def test_a_loopback_bind_is_refused_before_anything_is_applied(tmp_path: Path, fake: FakeKube) -> None:
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "run", RECIPE, "--on", "kube")
    assert ran.returncode == 64 and "resources.bind=0.0.0.0" in ran.stderr
    assert fake.requests == []


def test_ps_logs_stop_on_kube(tmp_path: Path, fake: FakeKube) -> None:
    fake.log = "line one\nred \x1b]0;title\x07 end\n"
    config = _kubeconfig(tmp_path / "kc", fake.start())
    assert _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube:lab").returncode == 0
    ps = _cli(tmp_path, config, "ps", "--on", "kube", "--json")
    assert ps.returncode == 0, ps.stderr
    assert '"recipe": "qwen3.5-35b-a3b"' in ps.stdout and '"ready": true' in ps.stdout
    listed = [r for r in fake.requests if r.path == "/api/v1/namespaces/llm/pods"][-1]
    assert listed.query["labelSelector"] == "app.kubernetes.io/managed-by=metralectl"
    logs = _cli(tmp_path, config, "logs", RECIPE, "--on", "kube", "--tail", "50")
    assert logs.returncode == 0 and "line one" in logs.stdout and "\x1b" not in logs.stdout
    assert "red \\x1b]0;title\\x07 end" in logs.stdout
    log_call = [r for r in fake.requests if r.path.endswith("/log")][-1]
    assert log_call.query["tailLines"] == "50" and log_call.query["container"] == "engine"
    assert int(log_call.query["limitBytes"]) <= 1 << 20
    stop = _cli(tmp_path, config, "stop", RECIPE, "--on", "kube")
    assert stop.returncode == 0, stop.stderr
    selectors = {r.query.get("labelSelector") for r in fake.requests if r.method == "GET" and "pods" not in r.path
                 and r.path.rsplit("/", 1)[-1] in ("deployments", "services", "leaderworkersets")}
    assert selectors == {"app.kubernetes.io/managed-by=metralectl,ai.metrale.metralectl.recipe=qwen3.5-35b-a3b"}
    assert fake.objects == {} and f"deleted Deployment llm/{NAME}" in stop.stdout
    assert _cli(tmp_path, config, "stop", "--on", "kube").returncode == 64  # RECIPE or --all


def test_a_huge_answer_is_cut_and_a_hostile_status_escaped(tmp_path: Path, fake: FakeKube) -> None:
    fake.huge_pods = True
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ps = _cli(tmp_path, config, "ps", "--on", "kube")
    assert ps.returncode == 65 and "metralectl stopped reading it" in ps.stderr
    fake.huge_pods, fake.refuse_apply = False, "forbidden \x1b]0;pwned\x07 " + "x" * 5000
    ran = _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube")
    assert ran.returncode == 69 and "answered 403: forbidden \\x1b]0;pwned\\x07" in ran.stderr
    assert "\x1b]" not in ran.stderr and len(ran.stderr) < 2000 and "RBAC" in ran.stderr
    assert fake.objects == {} and not any(r.method == "DELETE" for r in fake.requests)  # nothing was applied


def test_a_missing_context_is_a_usage_error_naming_the_contexts(tmp_path: Path, fake: FakeKube) -> None:
    config = _kubeconfig(tmp_path / "kc", fake.start())
    ran = _cli(tmp_path, config, "ps", "--on", "kube:nope")
    assert ran.returncode == 64 and "contexts: lab, spare" in ran.stderr and "Traceback" not in ran.stderr
    assert _cli(tmp_path, config, "ps", "--on", "docker").returncode == 64
    assert fake.requests == []


def test_a_credential_plugin_is_refused_with_the_fix(tmp_path: Path, fake: FakeKube) -> None:
    config = _kubeconfig(tmp_path / "kc", fake.start(), user={"exec": {"command": "aws", "args": ["eks"]}})
    ran = _cli(tmp_path, config, "ps", "--on", "kube")
    assert ran.returncode == 64 and "credential plugin (exec)" in ran.stderr and "--token" in ran.stderr
    assert fake.requests == []


def test_kubeconfig_client_certificates_token_file_and_namespace(tmp_path: Path) -> None:
    from metralectl.seams.kube.config import load

    cert, key = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", "-----BEGIN KEY-----\nk\n"
    (tmp_path / "key.pem").write_text(key)
    path = _kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443/",
                       user={"client-certificate-data": base64.b64encode(cert.encode()).decode(),
                             "client-key": "key.pem"},
                       cluster={"certificate-authority-data": base64.b64encode(b"CA PEM").decode()})
    config = load(None, path)
    assert (config.context, config.server, config.namespace) == ("lab", "https://127.0.0.1:6443", "llm")
    assert (config.client_cert_pem, config.client_key_pem, config.ca_pem, config.token) == (cert, key, "CA PEM", None)
    (tmp_path / "tok").write_text("from-file\n")
    spare = load("spare", _kubeconfig(tmp_path / "kc2", "http://127.0.0.1:1", user={"tokenFile": "tok"}))
    assert (spare.token, spare.namespace, spare.server) == ("from-file", "default", "http://127.0.0.1:9")


def test_the_api_server_over_tls_with_its_own_ca(tmp_path: Path, fake: FakeKube) -> None:
    """A CA made here signs the fake's certificate for 127.0.0.1; the kubeconfig's certificate-authority-data is
    what the client trusts (and a client certificate signed by the same CA is presented and required)."""
    pki = _pki(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    server_ctx.load_verify_locations(pki / "ca.pem")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    url = fake.start(server_ctx)
    b64 = lambda name: base64.b64encode((pki / name).read_bytes()).decode()  # noqa: E731
    config = _kubeconfig(tmp_path / "kc", url, user={"client-certificate-data": b64("client.pem"),
                                                      "client-key-data": b64("client.key")},
                         cluster={"certificate-authority-data": b64("ca.pem")})
    ps = _cli(tmp_path, config, "ps", "--on", "kube", "--json")
    assert ps.returncode == 0, ps.stderr
    assert ps.stdout.strip() == "[]" and fake.requests[0].path == "/api/v1/namespaces/llm/pods"
    untrusted = _kubeconfig(tmp_path / "kc2", url, user={"client-certificate-data": b64("client.pem"),
                                                          "client-key-data": b64("client.key")})
    refused = _cli(tmp_path, untrusted, "ps", "--on", "kube")
    assert refused.returncode == 69 and "did not answer" in refused.stderr


def _pki(tmp_path: Path) -> Path:
    """A self-signed CA, a server certificate for 127.0.0.1 and a client certificate, with openssl."""
    pki = tmp_path / "pki"
    pki.mkdir()

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=test-ca")
    (pki / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subject, ext in (("server", "/CN=127.0.0.1", ["-extfile", "san.ext"]), ("client", "/CN=me", [])):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", subject)
        ossl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             f"{who}.pem", "-days", "2", *ext)
    return pki


def test_stop_on_kube_waits_until_the_pods_ended(tmp_path: Path, fake: FakeKube) -> None:
    """Deleting only asks: the engine holds its GPU and port until its pod ended. stop returned while the pod was
    still terminating, and a `run` right after found them taken."""
    config = _kubeconfig(tmp_path / "kc", fake.start())
    assert _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube:lab").returncode == 0
    fake.terminating_lists = 2
    stop = _cli(tmp_path, config, "stop", RECIPE, "--on", "kube")
    assert stop.returncode == 0, stop.stderr
    assert "waiting for 1 pod to end: " + NAME in stop.stderr and "every pod ended" in stop.stderr, stop.stderr
    deleted_at = max(i for i, r in enumerate(fake.requests) if r.method == "DELETE")
    lists = [r for r in fake.requests[deleted_at:] if r.method == "GET" and r.path.endswith("/pods")]
    assert len(lists) == 3  # two that still listed it, then one that did not
    assert fake.lingering[next(iter(fake.lingering))][1] == 0


def test_a_pod_that_never_ends_fails_stop_naming_it() -> None:
    from metralectl.errors import ExitCode, MetralError
    from metralectl.lifecycle.kube_run import wait_gone

    class Stuck:
        asked = 0

        def pods(self, namespace: str, selector: str) -> list[dict[str, object]]:
            self.asked += 1
            return [{"metadata": {"name": "metralectl-x-0"}}, {"metadata": {"name": "metralectl-x-0-1\x1b[2J"}}]

    now = [0.0]
    said: list[str] = []
    client = Stuck()
    with pytest.raises(MetralError) as err:
        wait_gone(client, "llm", "x", 60.0, said.append, sleep=lambda s: now.__setitem__(0, now[0] + s),  # type: ignore[arg-type]
                  clock=lambda: now[0], poll_s=2.0)
    assert err.value.exit_code == ExitCode.FAILED and "2 pods of what was deleted still there after 60 s" in str(err.value)
    assert "\x1b" not in str(err.value) and "metralectl-x-0-1" in str(err.value)
    assert client.asked == 31 and said == ["waiting for 2 pods to end: metralectl-x-0, metralectl-x-0-1\\x1b[2J"]


def test_logs_follow_on_kube_prints_each_line_as_the_api_server_streams_it(tmp_path: Path, fake: FakeKube) -> None:
    """`logs -f --on kube` was refused. Now the pod's last --tail lines, then each line as it comes (read while the
    stream is still open), escaped, until the stream ends (the container exited): then exit 0, said on stderr."""
    import threading

    fake.log = "history line\n"
    fake.follow = [b"second li", b"ne\nred \x1b]0;title\x07 end\n", b"last, with no newline"]
    fake.follow_gate = threading.Event()
    config = _kubeconfig(tmp_path / "kc", fake.start())
    assert _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "logs", RECIPE, "--on", "kube", "-f", "-n", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, config))
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(3)]  # the last piece is not written yet: these came streamed
        assert seen == ["history line\n", "second line\n", "red \\x1b]0;title\\x07 end\n"], seen
        assert proc.poll() is None
        fake.follow_gate.set()
        out, err = proc.communicate(timeout=60)
    finally:
        fake.follow_gate.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == "last, with no newline\n"
    assert "ended" in err and "Traceback" not in err
    call = [r for r in fake.requests if r.path.endswith("/log")][-1]
    assert call.query["follow"] == "true" and call.query["tailLines"] == "20" and call.query["container"] == "engine"


def test_a_followed_line_is_kept_to_its_limit_however_the_stream_is_cut() -> None:
    """A followed log has no total cap (it runs until the container exits), so each line has one: an engine (or a
    server) that sends a line with no end cannot grow metralectl's memory."""
    from metralectl.seams.kube.client import _lines

    stream = b"one\n" + b"x" * 100 + b"\ntwo\nthree"
    for cut in range(1, len(stream)):
        assert list(_lines(iter([stream[:cut], stream[cut:]]), 50)) == [
            "one", "x" * 50 + " [... 50 more bytes of this line dropped]", "two", "three"], cut
    endless = (b"y" * 4096 for _ in range(10_000))  # 40 MiB, no newline
    assert list(_lines(endless, 1024)) == ["y" * 1024 + f" [... {40960000 - 1024} more bytes of this line dropped]"]


def test_ctrl_c_stops_a_followed_log_on_kube_with_130_and_no_traceback(tmp_path: Path, fake: FakeKube) -> None:
    import threading

    fake.follow = [b"more\n", b"never sent\n"]
    fake.follow_gate = threading.Event()  # never set here: the stream stays open until the test ends
    config = _kubeconfig(tmp_path / "kc", fake.start())
    assert _cli(tmp_path, config, "run", RECIPE, *SETS, "--on", "kube").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "logs", RECIPE, "--on", "kube", "-f"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, config))
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(2)] == ["INFO engine up\n", "more\n"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        fake.follow_gate.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
