"""A local stand-in for the Hugging Face Hub, for tests: real HTTP on 127.0.0.1, the routes and headers
huggingface_hub (checked against 2.4) reads, so the REAL download code runs with
`HF_ENDPOINT=http://127.0.0.1:PORT`.

Routes (as the Hub answers them):
  GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]   model info: sha, gated, siblings (+ size, blobId, lfs)
  GET  /api/models/ORG/NAME/tree/REV[/PATH][?recursive=]   tree listing (files and directories)
  POST /api/models/ORG/NAME/paths-info/REV                 paths info
  HEAD|GET /ORG/NAME/resolve/REV/PATH   regular file: 200 + ETag (git oid), X-Repo-Commit, Content-Length;
                                        LFS file: 302 to the "CDN" + X-Linked-Etag (sha256), X-Linked-Size
  HEAD|GET /cdn/SHA256                  LFS content with Range (206 + Content-Range) support
The CDN is addressed as http://localhost:PORT (another host name than the API's 127.0.0.1), so the
client treats it like the real CDN: metadata from the 302 itself, no Authorization forwarded.
No xet headers are ever sent, so huggingface_hub downloads over plain HTTP.

Switches: a gated repo (401 without a token, 403 for a token without access, with the Hub's
X-Error-Code/X-Error-Message), an invalid token (401 "Invalid credentials in Authorization header"),
and per-file faults: "kill" (connection dropped mid-body), "truncate" (a consistently shorter
object), "corrupt" (same size, different bytes), "slow" (rate-limited body), "stall" (the first
`after` bytes of the body, then nothing until the client hangs up). `ranges = False` makes the server
ignore Range (200 with the whole body, as a CDN that does not honour it); a Range request whose
If-Range names another ETag gets the whole body too (RFC 9110 §13.1.5).

Hostile modes (a mirror that lies, for tests/unit/test_pull_hostile.py): `info_edit` rewrites the
model-info answer (crafted names, commits, hashes, sizes, duplicates); `resolve_headers` are merged
into every resolve answer (an ETag or X-Repo-Commit of `../../x`); `redirect_loop` paths redirect to
themselves forever; `redirect_small` sends regular files to the CDN host too; and the faults "grow"
(`extra` bytes more than listed, Content-Length honest), "endless" (a chunked body that never ends),
"bad-range" (206 with a Content-Range that is not the body's) and "gzip" (a compressed body);
`harnesses` answers /api/agent-harnesses, which huggingface_hub 2.4 asks and caches in HF_HOME.

Standalone: python3 -m tests.fakehub.server [--port N]  serves a demo repository until Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
INVALID_TOKEN = "Invalid credentials in Authorization header"


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeFile:
    path: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def oid(self) -> str:
        # For an LFS file git stores the pointer, so its blob id is the pointer's.
        return git_oid(self.pointer) if self.lfs else git_oid(self.data)

    @property
    def pointer(self) -> bytes:
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n"
                .encode())


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, FakeFile]
    commit: str
    gated: str | None = None  # "auto" | "manual": file downloads need an authorized token
    authorized: set[str] = field(default_factory=set)  # tokens granted access to a gated repo
    gate_api: bool = False  # also refuse the model-info/tree API (the Hub did so in the past)

    @classmethod
    def flagship(cls) -> FakeRepo:
        """A tiny stand-in for the flagship's checkpoint (its config and one small weights file)."""
        return cls.build("Sehyo/Qwen3.5-35B-A3B-NVFP4", {"config.json": b'{"model_type": "qwen3_5_moe"}',
                                                         "model.safetensors": b"\1" * 4096})

    @classmethod
    def build(cls, repo_id: str, files: dict[str, bytes], commit: str | None = None, **kw: object) -> FakeRepo:
        entries = {p: FakeFile(p, d, p.endswith(LFS_SUFFIXES)) for p, d in files.items()}
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        commit = commit or digest.hexdigest()
        return cls(repo_id, entries, commit, **kw)  # type: ignore[arg-type]


@dataclass
class Fault:
    kind: str  # "kill" | "truncate" | "corrupt" | "slow"
    times: int | None = None  # GETs it still applies to; None = every one
    at: float = 0.5  # "kill": fraction of the body sent before the connection drops
    rate: int = 256_000  # "slow": bytes per second
    after: int = 0  # "stall": bytes sent before the body stops
    extra: int = 1  # "grow": bytes beyond the listed size


@dataclass
class Request:
    method: str
    path: str
    status: int
    range: str | None
    authorized: bool
    if_range: str | None = None
    sent: int = 0  # body bytes written (HEAD: 0)


class FakeHub:
    def __init__(self, repos: list[FakeRepo] | None = None, valid_tokens: set[str] | None = None,
                 lfs_redirect: bool = True) -> None:
        self.repos = {r.repo_id: r for r in repos or []}
        self.valid_tokens = valid_tokens if valid_tokens is not None else {"hf_valid"}
        self.lfs_redirect = lfs_redirect
        self.ranges = True  # False: Range is ignored (200, whole body)
        self.stopping = threading.Event()
        self.faults: dict[str, Fault] = {}  # file path -> fault
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.connections: set[socket.socket] = set()  # open keep-alive connections, cut by stop()
        self.info_edit: Callable[[dict[str, object]], object] | None = None  # a crafted model-info answer
        self.resolve_headers: dict[str, str] = {}  # merged into every resolve answer (hostile headers)
        self.redirect_loop: set[str] = set()  # repo paths whose resolve URL redirects to itself
        self.redirect_small = False  # regular files are redirected to the CDN host as LFS files are
        self.harnesses: object = None  # an answer to /api/agent-harnesses (huggingface_hub 2.4 caches it in HF_HOME)

    # --- control ------------------------------------------------------------------------------
    def start(self, port: int = 0) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fakehub").start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (a client's pooled keep-alive one included)."""
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            conns, self.connections = list(self.connections), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fault(self, path: str, kind: str, **kw: object) -> None:
        self.faults[path] = Fault(kind, **kw)  # type: ignore[arg-type]

    def clear_faults(self) -> None:
        self.faults.clear()

    def gets(self, fragment: str = "") -> list[Request]:
        """Content GETs (resolve or CDN) whose path contains fragment."""
        with self._lock:
            return [r for r in self.log if r.method == "GET" and "/api/" not in r.path and fragment in r.path]

    def record(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)

    def take_fault(self, path: str) -> Fault | None:
        with self._lock:
            fault = self.faults.get(path)
            if fault is None or fault.times == 0:
                return None
            if fault.times is not None:
                fault.times -= 1
            return fault

    def peek_fault(self, path: str) -> Fault | None:
        fault = self.faults.get(path)
        return fault if fault is not None and fault.times != 0 else None


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub and its CDN serve

    def log_message(self, format: str, *args: object) -> None:  # quiet: the hub keeps its own log
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub.connections.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # --- plumbing -----------------------------------------------------------------------------
    def _token(self) -> tuple[str | None, bool]:
        header = self.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        return token, token is not None and token in self.hub.valid_tokens

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_length: int | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.hub.record(self._request(status, len(body) if self.command != "HEAD" else 0))

    def _request(self, status: int, sent: int) -> Request:
        return Request(self.command, self.path, status, self.headers.get("Range"), "Authorization" in self.headers,
                       self.headers.get("If-Range"), sent)

    def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _json(self, data: object) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _repo(self, repo_id: str, *, api: bool) -> FakeRepo | None:
        """The repo if this caller may see it; otherwise the Hub's answer has been sent."""
        token, valid = self._token()
        if token is not None and not valid:
            self._error(401, None, INVALID_TOKEN)
            return None
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404 if valid else 401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and (not api or repo.gate_api) and token not in repo.authorized:
            if not valid:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                            "and be authenticated to access it. Please log in.")
            else:
                self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                            f"authorized list. Visit https://huggingface.co/{repo_id} to ask for access.")
            return None
        return repo

    def _commit(self, repo: FakeRepo, revision: str) -> str | None:
        if revision in ("main", repo.commit):
            return repo.commit
        self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return None

    # --- routes -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        try:
            if parts == ["api", "agent-harnesses"] and self.hub.harnesses is not None:
                self._json(self.hub.harnesses)
            elif parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(f"{parts[2]}/{parts[3]}", parts[4:], query)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            elif parts[0] == "cdn" and len(parts) == 2:
                self._cdn(parts[1])
            else:
                self._error(404, None, "Not Found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _api(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, api=True)
        if repo is None:
            return
        if not rest or rest[0] == "revision":
            commit = self._commit(repo, rest[1] if len(rest) > 1 else "main")
            if commit is None:
                return
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = [self._entry(f, blobs_only=not blobs) for f in repo.files.values()]
            info: dict[str, object] = {
                "_id": "fake" + repo.commit[:20], "id": repo.repo_id, "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0], "sha": commit, "private": False,
                "gated": repo.gated or False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": siblings}
            self._json(self.hub.info_edit(info) if self.hub.info_edit is not None else info)
        elif rest[0] == "tree" and len(rest) >= 2:
            if self._commit(repo, rest[1]) is None:
                return
            prefix = "/".join(rest[2:]).strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._json(self._tree(repo, prefix, recursive))
        elif rest[0] == "paths-info" and len(rest) >= 2 and self.command == "POST":
            if self._commit(repo, rest[1]) is None:
                return
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            try:
                wanted = json.loads(raw).get("paths", [])
            except ValueError:
                wanted = parse_qs(raw).get("paths", [])
            self._json([self._tree_entry(repo.files[p]) for p in wanted if p in repo.files])
        else:
            self._error(404, None, "Not Found")

    @staticmethod
    def _entry(f: FakeFile, blobs_only: bool) -> dict[str, object]:
        if blobs_only:
            return {"rfilename": f.path}
        entry: dict[str, object] = {"rfilename": f.path, "size": len(f.data), "blobId": f.oid}
        if f.lfs:
            entry["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": len(f.pointer)}
        return entry

    @staticmethod
    def _tree_entry(f: FakeFile) -> dict[str, object]:
        entry: dict[str, object] = {"type": "file", "oid": f.oid, "size": len(f.data), "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": len(f.pointer)}
        return entry

    def _tree(self, repo: FakeRepo, prefix: str, recursive: bool) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        dirs: set[str] = set()
        for f in sorted(repo.files.values(), key=lambda f: f.path):
            if prefix and not f.path.startswith(prefix + "/"):
                continue
            rel = f.path[len(prefix) + 1:] if prefix else f.path
            if "/" in rel and not recursive:
                dirs.add((prefix + "/" if prefix else "") + rel.split("/")[0])
                continue
            if recursive:
                parent = f.path.rsplit("/", 1)[0] if "/" in f.path else ""
                while parent and parent != prefix:
                    dirs.add(parent)
                    parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
            out.append(self._tree_entry(f))
        out += [{"type": "directory", "oid": git_oid(d.encode()), "size": 0, "path": d} for d in sorted(dirs)]
        return out

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_id, api=False)
        if repo is None:
            return
        commit = self._commit(repo, revision)
        if commit is None:
            return
        f = repo.files.get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", {"X-Repo-Commit": commit})
            return
        common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if f.path in self.hub.redirect_loop:
            self._send(302, b"", {**common, "Location": self.path, **self.hub.resolve_headers})
            return
        if f.lfs or self.hub.redirect_small:
            fault = self.hub.peek_fault(f.path)
            size = len(_served(f, fault))
            linked = {**common, "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(size),
                      "ETag": f'"{f.oid}"', **self.hub.resolve_headers}
            if self.hub.lfs_redirect:
                location = f"http://localhost:{self.hub.port}/cdn/{f.sha256}"
                self._send(302, b"", {**linked, "Location": location})
                return
            self._content(f, linked)
            return
        self._content(f, {**common, "ETag": f'"{f.oid}"', "Content-Type": "application/octet-stream",
                          **self.hub.resolve_headers})

    def _cdn(self, sha256: str) -> None:
        for repo in self.hub.repos.values():
            for f in repo.files.values():
                if (f.lfs or self.hub.redirect_small) and f.sha256 == sha256:
                    self._content(f, {"ETag": f'"{sha256}"', "Content-Type": "application/octet-stream",
                                      "Accept-Ranges": "bytes"})
                    return
        self._error(404, None, "NoSuchKey")

    def _content(self, f: FakeFile, headers: dict[str, str]) -> None:
        fault = self.hub.take_fault(f.path) if self.command == "GET" else self.hub.peek_fault(f.path)
        data = _served(f, fault)
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        honoured = self.hub.ranges and (if_range is None or if_range == headers.get("ETag"))
        if wanted and wanted.startswith("bytes=") and honoured:
            first = wanted[6:].split("-")[0]
            start = min(int(first or 0), len(data))
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        if fault is not None and fault.kind == "bad-range":
            status, headers = 206, {**headers, "Content-Range": f"bytes 0-{len(data) // 2}/{len(data)}"}
        if fault is not None and fault.kind == "gzip":
            headers = {**headers, "Content-Encoding": "gzip"}
        body = data[start:]
        if fault is not None and fault.kind == "endless" and self.command == "GET":
            self._endless(status, headers, body)
            return
        if self.command == "HEAD":
            self._send(status, b"", headers, content_length=len(body))
            return
        if fault is not None and fault.kind == "kill":
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: int(len(body) * fault.at)])
            self.wfile.flush()
            self.hub.record(self._request(status, int(len(body) * fault.at)))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.kind == "slow":
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.hub.record(self._request(status, len(body)))
            chunk = max(1024, fault.rate // 20)
            for i in range(0, len(body), chunk):
                self.wfile.write(body[i:i + chunk])
                self.wfile.flush()
                time.sleep(chunk / fault.rate)
            return
        if fault is not None and fault.kind == "stall":
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: fault.after])
            self.wfile.flush()
            self.hub.record(self._request(status, min(fault.after, len(body))))
            self._hold()
            return
        self._send(status, body, headers)

    def _endless(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """The body, then more, chunked, without end: until the client hangs up (or the hub stops)."""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.hub.record(self._request(status, len(body)))
        self.close_connection = True
        chunk = body or b"\0" * 65536
        while not self.hub.stopping.is_set():
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            except OSError:
                return
            chunk = b"\0" * 65536

    def _hold(self) -> None:
        """Send nothing more until the client hangs up (or the hub stops); then drop the connection."""
        import select

        self.close_connection = True
        while not self.hub.stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return  # the client closed its end
                except OSError:
                    return
                time.sleep(0.1)  # a pipelined request: not ours to read; keep waiting for the hang-up


def _served(f: FakeFile, fault: Fault | None) -> bytes:
    """The bytes the server hands out for f under a fault (what a broken CDN object would hold)."""
    if fault is None:
        return f.data
    if fault.kind == "truncate":
        return f.data[: len(f.data) // 2]
    if fault.kind == "grow":
        return f.data + b"\xff" * fault.extra
    if fault.kind == "corrupt":
        middle = len(f.data) // 2
        return f.data[:middle] + bytes([f.data[middle] ^ 0xFF]) + f.data[middle + 1:]
    return f.data


def demo_repo(repo_id: str = "metralectl-test/tiny-model", shard_bytes: int = 1_500_000) -> FakeRepo:
    """A small checkpoint shaped like a real one: config, tokenizer, index, two safetensors shards."""
    import random

    rng = random.Random(repo_id + str(shard_bytes))
    shard1 = rng.randbytes(shard_bytes)
    shard2 = rng.randbytes(shard_bytes * 2 // 3)
    index = {"metadata": {"total_size": len(shard1) + len(shard2)},
             "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                            "b.weight": "model-00002-of-00002.safetensors"}}
    return FakeRepo.build(repo_id, {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "config.json": json.dumps({"model_type": "qwen3_5_moe", "hidden_size": 2048}).encode(),
        "tokenizer_config.json": b'{"tokenizer_class": "PreTrainedTokenizerFast"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001-of-00002.safetensors": shard1,
        "model-00002-of-00002.safetensors": shard2,
        "original/params.json": b'{"dim": 2048}',
    })


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="metralectl-test/tiny-model")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--gated", action="store_true", help="gate the repo (token hf_valid is NOT authorized)")
    args = parser.parse_args()
    hub = FakeHub([demo_repo(args.repo)])
    if args.gated:
        hub.repos[args.repo].gated = "manual"
    hub.start(args.port)
    print(f"HF_ENDPOINT={hub.endpoint}  (repo {args.repo}, commit {hub.repos[args.repo].commit}); Ctrl-C stops",
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
