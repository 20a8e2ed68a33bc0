#!/usr/bin/env python3
"""TEST FIXTURE - a stand-in for the Metrale engine's ``met`` binary. NOT the engine.

This program imitates, for metralectl's tests, what an operator (and metralectl) can observe of
``met``: its command line, its start-up log lines, its HTTP API and its failure modes. It loads no
model, touches no GPU and generates canned tokens. It is a single file using only the Python 3
standard library (>= 3.10) so it can run inside a tiny container with the host's bind-mounted
interpreter (see tests/docker_image/).

Command line
------------
    metrale_double.py --version
        prints ``met 1.0.0-beta-preview (test double)``
    metrale_double.py serve MODEL [--port N] [--bind ADDR] [--any-flag [VALUE]] ...
        MODEL is the HF id (positional); ``--model-from-path PATH`` may replace it.
        Every flag is accepted and recorded (GET /serve-config). Flags the real engine declares
        as presence-only booleans (``--speculative``, ``--enable-prefix-caching``, ...) refuse a
        value exactly like ``met`` does (``--enable-prefix-caching true`` exits 2), and the
        documented conflicts are refused (``--dflash`` with ``--speculative``,
        ``--prompt-lookup-decoding`` without ``--speculative`` ...).
        Multi-rank: ``--rank R --world-size W --master-addr A --master-port P``. Rank 0 is the head
        (serves HTTP; listens for the rendezvous on A:P); rank > 0 connects to A:P, prints worker
        lines and serves nothing. The rendezvous is real TCP (class ``Rendezvous``): mismatching
        --speculative/--num-drafts/--mtp-quantization make the worker exit 1 with the engine's
        "SSM intermediate-buffer error"; different NCCL_SOCKET_IFNAME values leave every rank
        "stuck at all ranks ready"; no worker in time is a "rendezvous timeout" (exit 1); a worker
        lost after the rendezvous makes the head's requests hang while /health stays 200.

Start-up log (stdout, flushed line by line), in one of four formats (DOUBLE_LOG_FORMAT)
-------------------------------------------------------------------------------------
tracing (the default: today's engine, MI serve_router.rs@ec63e7a and its field logs), every line
    ``YYYY-MM-DDTHH:MM:SSZ  INFO <message>`` (ERROR/WARN for failures and the exposure warning):
    Metrale Engine starting... (<version line>: rank R/W, model MODEL)
    Port: PORT
    Selected kernel target: (test-double, <model>, <kv dtype>) (0 modules) — quant compat: ...
    Fast-loaded N weight tensors
    KV cache: ... -> N max KV tokens (test double)
    API reachable only from this machine (loopback). ...   (or WARN "Metrale Engine is listening on ...")
    Server live and ready at 127.0.0.1:PORT running MODEL   (a 0.0.0.0 / :: bind prints 127.0.0.1)
tracing-module: the same with microseconds and a module path, as older builds wrote it:
    ``YYYY-MM-DDTHH:MM:SS.ffffffZ  INFO spark::main_modules::serve: <message>``
book (the engine book's older engine):
    loading MODEL / kernel target: ... / loaded N tensors in X.Xs
    captured graph for batch=1      (then batch=2, 4, ... up to --max-batch-size)
    Listening on BIND:PORT          (the book's readiness marker)
    + "bind 127.0.0.1 is loopback-only ..." or "WARNING: ... exposed to the LAN ..."
silent: no boot line at all (no progress, no ready line); failures still print their ERROR line.
DOUBLE_LOG_ANSI=1 colours the tracing prefix as tracing does on a TTY (dim time, coloured level).

When /health turns 200 (DOUBLE_HTTP_BIND): ``early`` (the default with book) binds the HTTP socket
before loading; it answers 503 until ready. ``late`` (the default otherwise, like today's engine)
binds only once the model is loaded: connection refused until then, 200 from the first answer. The
double records the wall-clock moment it turns ready (GET /_double/state ``ready_at``), set just
before any 200 can be answered, so tests can measure how soon metralectl saw it.

HTTP API
--------
GET  /health: today's bodies (200 {"status":"ready","model":M}, 503 {"status":"loading"}, 503
     {"status":"faulted","reason":R} with DOUBLE_FAULT=gpu-fault), the book's with DOUBLE_LOG_FORMAT=book
     (200 {"status":"ok","model":M}, 503 {"error":{"type":"model_not_loaded",...}});
     /health/live (200; 503 faulted), /_double/state (the double's own facts: started_at, ready_at,
     log_format, http_bind, faulted — no such route on the engine), /v1/models (one model: id =
     --model-name / --served-model-name or MODEL), /metrics (Prometheus text), /serve-config (argv and
     its sha256 digest, the double's own digest), /hardware ("test-double"), /memory, /forward
POST /v1/chat/completions and /v1/completions (non-streaming and SSE ``stream: true``), /tokenize,
     /detokenize (one token per whitespace-separated word)
Other OpenAI routes (/v1/embeddings, /v1/responses, /v1/messages, ...) answer 501 "not supported".
Chat streaming: chunks carry ``choices[0].delta.reasoning_content`` for a couple of reasoning tokens
(unless --disable-thinking or ``chat_template_kwargs.enable_thinking: false``), then
``delta.content`` tokens, then a chunk with ``finish_reason``, then (if
``stream_options.include_usage``) a usage-only chunk with ``choices: []``, then ``data: [DONE]``.
``max_tokens`` / ``max_completion_tokens`` caps reasoning + content tokens (``finish_reason:
"length"``); ``ignore_eos: true`` (or ``min_tokens``) generates exactly ``max_tokens``. With
``tools`` and ``tool_choice`` "required" / a named function (or "auto" and the function's name in
the last user message) it answers with ``tool_calls``. ``--require-auth`` with ``--auth-token`` /
``--auth-tokens-file`` demands ``Authorization: Bearer`` on POST routes. ``--auto-swap`` with
DOUBLE_KNOWN_MODELS lets a request naming another known model swap it in (503 while swapping).

Environment
-----------
The real engine refuses to start when the environment carries an undeclared ``METRALE_*`` name.
The double does the same (prints an error naming it, exits 2); declared names are
METRALE_RATE_LIMIT_RPM, METRALE_RATE_LIMIT_TPM, METRALE_RATE_LIMIT_BURST_RPM,
METRALE_RATE_LIMIT_BURST_TPM, METRALE_MAX_BODY_BYTES (enforced: 413 above it) and METRALE_HOME.
So the double's own knobs deliberately do NOT start with METRALE_:

  DOUBLE_FAULT         comma-separated failure modes (default: none):
      exit-at-start    print "error: ..." ("Error: ..." in today's format) and exit 1 before loading
      exit-137         die by SIGKILL while loading (exit status 137 in a container; when the
                       double is PID 1 the kernel ignores a self-SIGKILL, so it exits 137 instead)
      never-ready      keep printing loading progress lines forever, never the marker
      stall            print the first loading lines, then go silent forever, never ready
      slow-ready       become ready only after DOUBLE_READY_DELAY seconds (default 3 here)
      loaded-zero      an empty HF cache: "loaded 0 tensors in 0.1s" and an error (book), or today's
                       "Error: Snapshot '0000000' has no weight files (metadata-only)"; exit 1
      oom              "error: out of memory ..." (book), or today's three "OOM watchdog: GPU free
                       memory critically low ..." readings and "... Terminating ..."; exit 1
      ignore-sigterm   log and ignore SIGTERM (docker stop then has to SIGKILL: 137)
      swap-fail        an --auto-swap load fails and the previous model is restored
      rendezvous-timeout  multi-rank start fails with a rendezvous timeout at once, exit 1
      worker-drop  a worker closes its rendezvous link right after joining but keeps running: the
                   head is ready and /health 200, but every request hangs
      gpu-fault    load, then latch a GPU fault instead of becoming ready: /health answers 503
                   {"status":"faulted","reason":DOUBLE_FAULT_REASON} and the double keeps running
      oom-after-ready  the engine's OOM watchdog as field logs show it: a first "OOM watchdog: GPU free
                   memory critically low ... [1/3]" before the ready line, ready (/health 200), then
                   [2/3] and [3/3] a second apart, "... Terminating ...", exit 1
  DOUBLE_LOG_FORMAT    tracing (default) | tracing-module | book | silent  (see Start-up log)
  DOUBLE_LOG_ANSI      1: colour codes in the tracing prefix
  DOUBLE_HTTP_BIND     early | late: when the HTTP socket is bound (default: early with book, else late)
  DOUBLE_FAULT_REASON  the reason a gpu-fault reports (default: an Xid 13 illegal memory access)
  DOUBLE_READY_DELAY   seconds from start to ready (default 0.5; 3 with slow-ready)
  DOUBLE_RENDEZVOUS_TIMEOUT  seconds a multi-rank start waits for its peers (default 60)
  DOUBLE_RANK_OVERRIDE what this rank reports at the rendezvous instead of its real values, e.g.
                       ``num-drafts=3`` or ``NCCL_SOCKET_IFNAME=eth9`` (comma-separated; keys:
                       speculative, num-drafts, mtp-quantization, NCCL_SOCKET_IFNAME)
  DOUBLE_TTFT_MS       delay before the first generated token, ms (default 20)
  DOUBLE_ITL_MS        delay between generated tokens, ms (default 5)
  DOUBLE_OUTPUT_TOKENS natural (EOS) length of a completion's content, tokens (default 16)
  DOUBLE_REASONING_TOKENS  reasoning tokens before the content (default 2)
  DOUBLE_TENSORS       N in "loaded N tensors" (default 1234)
  DOUBLE_SWAP_DELAY    seconds an --auto-swap load takes (default DOUBLE_READY_DELAY)
  DOUBLE_KNOWN_MODELS  comma-separated model ids that --auto-swap may swap to (default none)

SIGTERM: prints "received SIGTERM, shutting down" and "shutdown complete" ("Shutdown complete" in
today's format), exits 0 promptly.
Exit codes: 0 clean shutdown / --version, 1 start-up failure, 2 usage / environment refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENGINE_VERSION = "1.0.0-beta-preview"
VERSION_LINE = f"met {ENGINE_VERSION} (test double)"

DECLARED_ENV = {
    # name: (kind, default)
    "METRALE_RATE_LIMIT_RPM": ("int", "0"),
    "METRALE_RATE_LIMIT_TPM": ("int", "0"),
    "METRALE_RATE_LIMIT_BURST_RPM": ("int", ""),
    "METRALE_RATE_LIMIT_BURST_TPM": ("int", ""),
    "METRALE_MAX_BODY_BYTES": ("int", str(32 * 1024 * 1024)),
    "METRALE_HOME": ("path", "~/.metrale"),
}

# Flags the real engine declares as presence-only booleans: they never take a value.
BOOLEAN_FLAGS = frozenset({
    "no-fast-load", "speculative", "self-speculative", "ngram-speculative", "dflash",
    "prompt-lookup-decoding", "enable-prefix-caching", "disable-thinking", "profile",
    "adaptive-sampling", "require-auth", "auto-swap", "hermetic", "vision-allow-remote-images",
    "disable-template-overrides", "help",
})
INT_FLAGS = frozenset({
    "port", "rank", "world-size", "master-port", "max-seq-len", "max-batch-size",
    "max-prefill-tokens", "max-num-seqs", "num-drafts", "tp-size", "ep-size",
})
# (flag, conflicting flag) pairs the real engine refuses.
CONFLICTS = (
    ("dflash", "speculative"),
    ("prompt-lookup-decoding", "dflash"),
    ("prompt-lookup-decoding", "self-speculative"),
    ("prompt-lookup-decoding", "ngram-speculative"),
)
REQUIRES = (("prompt-lookup-decoding", "speculative"),)

KNOWN_FAULTS = frozenset({
    "exit-at-start", "exit-137", "never-ready", "stall", "slow-ready", "loaded-zero", "oom",
    "ignore-sigterm", "swap-fail", "rendezvous-timeout", "worker-drop", "gpu-fault", "oom-after-ready",
})
DEFAULT_FAULT_REASON = "CUDA error: an illegal memory access was encountered (Xid 13) on GPU 0"

UNSUPPORTED_PREFIXES = (
    "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/audio", "/v1/images",
    "/v1/moderations", "/v1/files", "/v1/batches", "/v1/fine_tuning", "/v1/assistants",
    "/v1/threads", "/v1/vector_stores", "/v1/events", "/v1/conversations", "/v1/uploads",
)

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
REASONING_WORDS = ("Thinking", "briefly", "about", "the", "question.")
CONTENT_WORDS = ("Paris", "is", "the", "capital", "of", "France.")
PREFIX_BLOCK = 16  # words per prefix-cache block


class UsageError(Exception):
    """Bad command line or environment: exit 2, like the real engine's argument parser."""


class StartupFailure(Exception):
    """A start-up failure: exit 1."""


LOG_FORMATS = ("tracing", "tracing-module", "book", "silent")
LOG = {"format": "tracing", "ansi": False}  # set from DOUBLE_LOG_FORMAT / DOUBLE_LOG_ANSI in main()
TRACING_TARGET = "spark::main_modules::serve"  # what older tracing builds printed before the message
LEVEL_COLOUR = {"TRACE": "35", "DEBUG": "34", "INFO": "32", "WARN": "33", "ERROR": "31"}


def log(msg: str, level: str = "INFO") -> None:
    """One log line in the chosen format: the book's bare text, or today's tracing-subscriber line."""
    fmt = LOG["format"]
    if fmt == "silent" and level != "ERROR":
        return
    if fmt in ("tracing", "tracing-module", "silent"):
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        if fmt == "tracing-module":
            stamp += f".{int(now % 1 * 1e6):06d}"
        stamp += "Z"
        lvl = f"{level:>5}"
        if LOG["ansi"]:
            stamp, lvl = f"\x1b[2m{stamp}\x1b[0m", f"\x1b[{LEVEL_COLOUR.get(level, '0')}m{lvl}\x1b[0m"
        target = f"{TRACING_TARGET}: " if fmt == "tracing-module" else ""
        msg = f"{stamp} {lvl} {target}{msg}"
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def say(book: str | None, today: str | None, level: str = "INFO") -> None:
    """A line whose wording differs between the book's engine and today's (None: that engine prints none)."""
    text = book if LOG["format"] == "book" else today
    if text is not None:
        log(text, level)


def today_format() -> bool:
    return LOG["format"] != "book"


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise UsageError(f"error: invalid value {raw!r} for {name} (a number)") from None


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise UsageError(f"error: invalid value {raw!r} for {name} (an integer)") from None


def self_digest() -> str:
    try:
        with open(os.path.abspath(__file__), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------- args


class ServeArgs:
    """The parsed `serve` command line. Unknown flags are kept, with or without a value."""

    def __init__(self, argv: list[str]):
        self.argv = list(argv)  # everything after the program name, starting with "serve"
        self.positional: list[str] = []
        self.flags: dict[str, object] = {}  # name -> last value (str) or True (presence)
        self.multi: dict[str, list[object]] = {}
        self._parse(argv[1:])
        self._validate()

    @staticmethod
    def _looks_like_value(tok: str) -> bool:
        if tok.startswith("--"):
            return False
        if tok.startswith("-") and len(tok) > 1:
            try:
                float(tok)
                return True
            except ValueError:
                return False
        return True

    def _set(self, name: str, value: object) -> None:
        if name == "served-model-name":
            name = "model-name"
        self.flags[name] = value
        self.multi.setdefault(name, []).append(value)

    def _parse(self, args: list[str]) -> None:
        i = 0
        while i < len(args):
            tok = args[i]
            if tok == "--":
                self.positional.extend(args[i + 1:])
                break
            if tok.startswith("--") and len(tok) > 2:
                name, eq, val = tok[2:].partition("=")
                if name in BOOLEAN_FLAGS:
                    if eq:
                        raise UsageError(
                            f"error: unexpected value '{val}' for '--{name}' found; "
                            "boolean flags are presence-only")
                    value: object = True
                elif eq:
                    value = val
                elif i + 1 < len(args) and self._looks_like_value(args[i + 1]):
                    value = args[i + 1]
                    i += 1
                else:
                    value = True
                self._set(name, value)
            elif tok in ("-h",):
                self._set("help", True)
            else:
                self.positional.append(tok)
            i += 1

    def _validate(self) -> None:
        if self.flags.get("help"):
            return
        if len(self.positional) > 1:
            raise UsageError(f"error: unexpected argument '{self.positional[1]}' found")
        if not self.positional and not isinstance(self.flags.get("model-from-path"), str):
            raise UsageError("error: the following required arguments were not provided: <MODEL> "
                             "(the test double has no Library dashboard)")
        for name in INT_FLAGS:
            if name in self.flags:
                v = self.flags[name]
                if not isinstance(v, str) or not v.lstrip("-").isdigit():
                    shown = "" if v is True else v
                    raise UsageError(f"error: invalid value '{shown}' for '--{name} <N>': "
                                     "expected an integer")
        if not 0 < self.port < 65536:
            raise UsageError(f"error: invalid value '{self.port}' for '--port <PORT>'")
        for a, b in CONFLICTS:
            if a in self.flags and b in self.flags:
                raise UsageError(f"error: the argument '--{a}' cannot be used with '--{b}'")
        for a, b in REQUIRES:
            if a in self.flags and b not in self.flags:
                raise UsageError(f"error: the argument '--{a}' requires '--{b}'")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"error: --rank {self.rank} is outside --world-size {self.world_size}")

    def get(self, name: str, default: str) -> str:
        v = self.flags.get(name)
        return v if isinstance(v, str) else default

    def int(self, name: str, default: int) -> int:
        v = self.flags.get(name)
        return int(v) if isinstance(v, str) else default

    @property
    def model(self) -> str:
        if self.positional:
            return self.positional[0]
        return os.path.basename(str(self.flags["model-from-path"]).rstrip("/")) or "model"

    @property
    def served_name(self) -> str:
        return self.get("model-name", self.model)

    @property
    def port(self) -> int:
        return self.int("port", 8888)

    @property
    def bind(self) -> str:
        return self.get("bind", "127.0.0.1")

    @property
    def rank(self) -> int:
        return self.int("rank", 0)

    @property
    def world_size(self) -> int:
        return self.int("world-size", 1)

    @property
    def max_seq_len(self) -> int:
        return self.int("max-seq-len", 32768)

    @property
    def max_batch_size(self) -> int:
        return self.int("max-batch-size", 8)

    def args_digest(self) -> str:
        return hashlib.sha256("\0".join(self.argv).encode()).hexdigest()


def check_environment(environ: dict[str, str]) -> dict[str, str]:
    """Refuse undeclared METRALE_* names (like the real engine); return the declared ones set."""
    undeclared = sorted(k for k in environ if k.startswith("METRALE_") and k not in DECLARED_ENV)
    if undeclared:
        raise UsageError(
            f"error: undeclared environment variable {undeclared[0]} "
            f"(refusing to start; declared METRALE_* levers: {', '.join(sorted(DECLARED_ENV))})"
            + (f"; also undeclared: {', '.join(undeclared[1:])}" if len(undeclared) > 1 else ""))
    present = {}
    for name, (kind, _default) in DECLARED_ENV.items():
        if name in environ:
            val = environ[name]
            if kind == "int" and not val.strip().isdigit():
                raise UsageError(f"error: invalid value {val!r} for {name} (a non-negative integer)")
            present[name] = val
    return present


def parse_faults(raw: str) -> frozenset[str]:
    faults = frozenset(f.strip() for f in raw.split(",") if f.strip())
    unknown = sorted(faults - KNOWN_FAULTS)
    if unknown:
        raise UsageError(f"error: unknown DOUBLE_FAULT {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(KNOWN_FAULTS))})")
    return faults


# -------------------------------------------------------------------------------------- metrics


class Metrics:
    """Thread-safe counters rendered in the Prometheus text exposition format (0.0.4)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests_total: dict[tuple[str, str], int] = {}  # (model, status) -> n
        self.active = 0
        self.ttft: dict[str, list] = {}  # model -> [bucket counts..., sum, count]
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.decoded_tokens = 0
        self.spec_verify: dict[tuple[str, str], int] = {}
        self.tool_calls = 0
        self.prefix_hits = 0
        self.prefix_misses = 0

    def observe_ttft(self, model: str, seconds: float) -> None:
        with self.lock:
            h = self.ttft.setdefault(model, [0] * len(TTFT_BUCKETS) + [0.0, 0])
            for i, le in enumerate(TTFT_BUCKETS):
                if seconds <= le:
                    h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    def render(self, model: str) -> str:
        def lbl(**kw: str) -> str:
            parts = []
            for k, v in kw.items():
                v = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                parts.append(f'{k}="{v}"')
            return "{" + ",".join(parts) + "}"

        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        with self.lock:
            family("metrale_requests_total", "counter", "Completed inference requests.")
            reqs = dict(self.requests_total) or {(model, "200"): 0}
            for (m, status), n in sorted(reqs.items()):
                out.append(f"metrale_requests_total{lbl(model=m, status=status)} {n}")
            family("metrale_requests_active", "gauge", "Inference requests in flight.")
            out.append(f"metrale_requests_active {self.active}")
            family("metrale_time_to_first_token_seconds", "histogram", "Time to first token.")
            hists = dict(self.ttft) or {model: [0] * len(TTFT_BUCKETS) + [0.0, 0]}
            for m, h in sorted(hists.items()):
                for i, le in enumerate(TTFT_BUCKETS):
                    out.append(f"metrale_time_to_first_token_seconds_bucket{lbl(model=m, le=repr(le))} {h[i]}")
                out.append(f"metrale_time_to_first_token_seconds_bucket{lbl(model=m, le='+Inf')} {h[-1]}")
                out.append(f"metrale_time_to_first_token_seconds_sum{lbl(model=m)} {h[-2]:.6f}")
                out.append(f"metrale_time_to_first_token_seconds_count{lbl(model=m)} {h[-1]}")
            family("metrale_prompt_tokens_total", "counter", "Prompt tokens processed.")
            out.append(f"metrale_prompt_tokens_total {self.prompt_tokens}")
            family("metrale_generation_tokens_total", "counter", "Tokens generated (emitted).")
            out.append(f"metrale_generation_tokens_total {self.generation_tokens}")
            family("metrale_decoded_tokens_total", "counter", "Tokens decoded, drafts included.")
            out.append(f"metrale_decoded_tokens_total {self.decoded_tokens}")
            family("metrale_spec_decode_verify_total", "counter",
                   "Speculative draft verifications by depth k and outcome.")
            spec = dict(self.spec_verify) or {("1", "accepted"): 0, ("1", "rejected"): 0}
            for (k, outcome), n in sorted(spec.items()):
                out.append(f"metrale_spec_decode_verify_total{lbl(k=k, outcome=outcome)} {n}")
            family("metrale_tool_calls_total", "counter", "Tool calls emitted.")
            out.append(f"metrale_tool_calls_total {self.tool_calls}")
            family("metrale_prefix_cache_hits_total", "counter", "Prefix-cache hits (requests).")
            out.append(f"metrale_prefix_cache_hits_total {self.prefix_hits}")
            family("metrale_prefix_cache_misses_total", "counter", "Prefix-cache misses (requests).")
            out.append(f"metrale_prefix_cache_misses_total {self.prefix_misses}")
            family("metrale_prefix_cache_hit_rate", "gauge", "Prefix-cache hit rate.")
            total = self.prefix_hits + self.prefix_misses
            out.append(f"metrale_prefix_cache_hit_rate {self.prefix_hits / total if total else 0.0:.6f}")
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------- state


class Engine:
    """What the HTTP handlers see: readiness, the served model, timing knobs, caches, metrics."""

    def __init__(self, args: ServeArgs, faults: frozenset[str], env_present: dict[str, str]):
        self.args = args
        self.faults = faults
        self.env_present = env_present
        self.model = args.model
        self.served_name = args.served_name
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.peer_lost = threading.Event()  # multi-rank head: a worker's rendezvous connection dropped
        self.swap_lock = threading.Lock()
        self.swapping = False
        self.metrics = Metrics()
        self.started = time.time()
        self.ready_at: float | None = None  # wall clock when /health turned 200 (set just before it does)
        self.fault_reason: str | None = None  # the GPU fault latch: /health answers 503 faulted once set
        bind_mode = os.environ.get("DOUBLE_HTTP_BIND", "").strip() or ("early" if LOG["format"] == "book" else "late")
        if bind_mode not in ("early", "late"):
            raise UsageError(f"error: invalid value {bind_mode!r} for DOUBLE_HTTP_BIND (early or late)")
        self.http_bind = bind_mode
        self.ttft_s = env_float("DOUBLE_TTFT_MS", 20.0) / 1000.0
        self.itl_s = env_float("DOUBLE_ITL_MS", 5.0) / 1000.0
        self.output_tokens = env_int("DOUBLE_OUTPUT_TOKENS", 16)
        self.reasoning_tokens = env_int("DOUBLE_REASONING_TOKENS", 2)
        self.tensors = env_int("DOUBLE_TENSORS", 1234)
        self.ready_delay = env_float("DOUBLE_READY_DELAY", 3.0 if "slow-ready" in faults else 0.5)
        self.swap_delay = env_float("DOUBLE_SWAP_DELAY", self.ready_delay)
        self.known_models = [m.strip() for m in os.environ.get("DOUBLE_KNOWN_MODELS", "").split(",")
                             if m.strip()]
        self.max_body = int(env_present.get("METRALE_MAX_BODY_BYTES") or 32 * 1024 * 1024)
        self.prefix_cache: set[str] = set()
        self.prefix_lock = threading.Lock()
        self.vocab: dict[int, str] = {}
        self.vocab_lock = threading.Lock()
        self.auth_tokens = self._load_auth_tokens()
        self.request_seq = 0

    def _load_auth_tokens(self) -> list[str]:
        if "require-auth" not in self.args.flags:
            return []
        tokens = [v for v in self.args.multi.get("auth-token", []) if isinstance(v, str)]
        path = self.args.flags.get("auth-tokens-file")
        if isinstance(path, str):
            try:
                with open(path, encoding="utf-8") as fh:
                    tokens += [ln.strip() for ln in fh if ln.strip() and not ln.startswith("#")]
            except OSError as exc:
                raise StartupFailure(f"error: cannot read --auth-tokens-file {path}: {exc}") from None
        if not tokens:
            raise UsageError("error: --require-auth needs --auth-token KEY or --auth-tokens-file PATH")
        return tokens

    def sleep(self, seconds: float) -> bool:
        """Sleep unless asked to stop; True when stopping."""
        return self.stopping.wait(max(0.0, seconds))

    # tokenization: one token per whitespace-separated word
    def tokenize(self, text: str) -> list[int]:
        ids = []
        with self.vocab_lock:
            for word in text.split():
                tid = zlib.crc32(word.encode()) % 150000
                self.vocab.setdefault(tid, word)
                ids.append(tid)
        return ids

    def detokenize(self, ids: list) -> str:
        with self.vocab_lock:
            return " ".join(self.vocab.get(int(i), f"<{int(i)}>") for i in ids)

    def prefix_lookup(self, words: list[str]) -> float:
        """Record the prompt's blocks; return the fraction of it served from the prefix cache."""
        if "enable-prefix-caching" not in self.args.flags or not words:
            return 0.0
        h = hashlib.sha256()
        matched = 0
        keys = []
        for start in range(0, len(words), PREFIX_BLOCK):
            h.update("\0".join(words[start:start + PREFIX_BLOCK]).encode())
            keys.append((start + min(PREFIX_BLOCK, len(words) - start), h.hexdigest()))
        with self.prefix_lock:
            for end, key in keys:  # leading blocks only: a prefix, not any shared block
                if key not in self.prefix_cache:
                    break
                matched = end
            self.prefix_cache.update(k for _, k in keys)
        with self.metrics.lock:
            if matched:
                self.metrics.prefix_hits += 1
            else:
                self.metrics.prefix_misses += 1
        return matched / len(words)


# ------------------------------------------------------------------------------------ generation


def message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class Plan:
    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.tool_calls: list[dict] = []
        self.finish_reason = "stop"

    @property
    def n_tokens(self) -> int:
        return len(self.reasoning) + len(self.content) + (1 if self.tool_calls else 0)


def plan_generation(engine: Engine, body: dict, chat: bool, last_user: str) -> Plan:
    plan = Plan()
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    budget = int(max_tokens) if isinstance(max_tokens, (int, float)) and max_tokens >= 0 else None
    ctk = body.get("chat_template_kwargs") or {}
    thinking = (chat and "disable-thinking" not in engine.args.flags
                and ctk.get("enable_thinking", True) is not False)
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    if chat and tools and choice != "none":
        names = [t.get("function", {}).get("name", "tool") for t in tools if isinstance(t, dict)]
        wanted = None
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
        elif choice == "required":
            wanted = names[0] if names else None
        else:
            wanted = next((n for n in names if n and n in last_user), None)
        if wanted:
            plan.tool_calls = [{"index": 0, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                "function": {"name": wanted, "arguments": "{}"}}]
            plan.finish_reason = "tool_calls"
            return plan
    n_reason = engine.reasoning_tokens if thinking else 0
    n_content = engine.output_tokens
    if budget is not None and (body.get("ignore_eos") or body.get("min_tokens")):
        n_content = max(budget - n_reason, 0)  # no EOS: runs into max_tokens
    total = n_reason + n_content
    if budget is not None and total >= budget and (total > budget or body.get("ignore_eos")):
        plan.finish_reason = "length"
        n_reason = min(n_reason, budget)
        n_content = budget - n_reason
    plan.reasoning = [(" " if i else "") + REASONING_WORDS[i % len(REASONING_WORDS)] for i in range(n_reason)]
    plan.content = [(" " if i else "") + CONTENT_WORDS[i % len(CONTENT_WORDS)] for i in range(n_content)]
    return plan


# ---------------------------------------------------------------------------------------- HTTP


def error_body(etype: str, message: str, code: object = None) -> dict:
    return {"error": {"type": etype, "message": message, "code": code}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine  # set on the subclass made by make_handler()

    def version_string(self) -> str:
        return "metrale-double"

    def log_message(self, format: str, *args: object) -> None:
        pass

    # ---- plumbing
    def _send_json(self, status: int, payload: object, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_text(self, status: int, text: str, ctype: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_loaded(self) -> None:
        e = self.engine
        msg = "model swap in progress" if e.swapping else "model is loading"
        self._send_json(503, error_body("model_not_loaded", msg, "model_not_loaded"),
                        {"Retry-After": "1"})

    def _health(self) -> None:
        """Today's engine: 200 {"status":"ready","model"}, 503 {"status":"loading"}, 503 {"status":"faulted",
        "reason"}; the book's: 200 {"status":"ok","model"}, 503 model_not_loaded."""
        e = self.engine
        if e.fault_reason is not None:
            return self._send_json(503, {"status": "faulted", "reason": e.fault_reason})
        ready = e.ready.is_set() and not e.swapping
        if not today_format():
            return self._send_json(200, {"status": "ok", "model": e.served_name}) if ready else self._not_loaded()
        if ready:
            return self._send_json(200, {"status": "ready", "model": e.served_name})
        self._send_json(503, {"status": "loading"})

    def _read_json(self) -> dict | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._send_json(400, error_body("invalid_request_error", "bad Content-Length"))
            return None
        if length > self.engine.max_body:
            self.close_connection = True
            self._send_json(413, error_body("payload_too_large",
                                            f"body of {length} bytes exceeds METRALE_MAX_BODY_BYTES="
                                            f"{self.engine.max_body}"))
            return None
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_json(400, error_body("invalid_request_error", "request body is not valid JSON"))
            return None
        if not isinstance(body, dict):
            self._send_json(400, error_body("invalid_request_error", "request body must be an object"))
            return None
        return body

    def _authorized(self) -> bool:
        tokens = self.engine.auth_tokens
        if not tokens:
            return True
        header = self.headers.get("Authorization", "")
        presented = header[7:].strip() if header.startswith("Bearer ") else ""
        ok = False
        for t in tokens:  # constant-time compare against every loaded token
            ok |= hmac.compare_digest(presented.encode(), t.encode())
        if not ok:
            self._send_json(401, error_body("authentication_error",
                                            "missing or invalid Authorization: Bearer token"),
                            {"WWW-Authenticate": "Bearer"})
        return ok

    # ---- routes
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        e = self.engine
        path = self.path.split("?", 1)[0]
        if path == "/health/live":
            if e.fault_reason is not None:
                self._send_json(503, {"status": "faulted", "reason": e.fault_reason})
            elif today_format():
                self._send_text(200, "ok", "text/plain; charset=utf-8")
            else:
                self._send_json(200, {"status": "alive"})
        elif path == "/health":
            self._health()
        elif path == "/_double/state":  # the TEST DOUBLE's own facts (no such route on the engine)
            self._send_json(200, {"test_double": True, "started_at": e.started, "ready_at": e.ready_at,
                                  "log_format": LOG["format"], "http_bind": e.http_bind,
                                  "faulted": e.fault_reason is not None})
        elif path == "/metrics":
            self._send_text(200, e.metrics.render(e.served_name), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            if not e.ready.is_set():
                return self._not_loaded()
            self._send_json(200, {"object": "list", "data": [{
                "id": e.served_name, "object": "model", "created": int(e.started),
                "owned_by": "metrale", "root": e.model, "max_model_len": e.args.max_seq_len}]})
        elif path == "/serve-config":
            self._send_json(200, serve_config(e))
        elif path == "/hardware":
            self._send_json(200, {
                "hardware_class": "test-double", "test_double": True, "vendor": "none",
                "arch": "none", "gpus": [], "host": socket.gethostname(),
                "cpu_arch": os.uname().machine, "engine_version": VERSION_LINE})
        elif path == "/memory":
            a = e.args
            self._send_json(200, {
                "test_double": True, "gpu_memory_utilization": float(a.get("gpu-memory-utilization", "0.90")),
                "kv_pool": {"dtype": a.get("kv-cache-dtype", "fp8"), "max_seq_len": a.max_seq_len,
                            "max_batch_size": a.max_batch_size, "block_tokens": 16,
                            "blocks_total": a.max_seq_len * a.max_batch_size // 16, "blocks_used": 0}})
        elif path == "/forward":
            self._send_json(200, {"test_double": True, "model": e.model, "forward_passes": 0})
        elif path.startswith(UNSUPPORTED_PREFIXES) or path.startswith("/v1/"):
            self._unsupported(path)
        else:
            self._send_json(404, error_body("not_found", f"no route {path}"))

    def _unsupported(self, path: str) -> None:
        self._send_json(501, error_body("not_supported_error",
                                        f"{path} is not supported by this server (metrale test double)",
                                        "not_supported"))

    def do_POST(self) -> None:
        e = self.engine
        path = self.path.split("?", 1)[0]
        routes = {"/v1/chat/completions": True, "/v1/completions": False}
        if path in routes:
            if not self._authorized():
                return
            body = self._read_json()
            if body is None:
                return
            return self._inference(body, chat=routes[path])
        if path in ("/tokenize", "/detokenize"):
            if not self._authorized():
                return
            body = self._read_json()
            if body is None:
                return
            if path == "/tokenize":
                if "messages" in body:
                    text = " ".join(message_text(m.get("content")) for m in body.get("messages") or []
                                    if isinstance(m, dict))
                else:
                    text = str(body.get("prompt", body.get("text", "")))
                ids = e.tokenize(text)
                return self._send_json(200, {"count": len(ids), "tokens": ids,
                                             "max_model_len": e.args.max_seq_len})
            return self._send_json(200, {"prompt": e.detokenize(body.get("tokens") or [])})
        if path.startswith(UNSUPPORTED_PREFIXES) or path.startswith("/v1/"):
            return self._unsupported(path)
        self._send_json(404, error_body("not_found", f"no route {path}"))

    # ---- inference
    def _inference(self, body: dict, chat: bool) -> None:
        e = self.engine
        requested = body.get("model")
        if (isinstance(requested, str) and "auto-swap" in e.args.flags and e.ready.is_set()
                and requested not in (e.model, e.served_name) and requested in e.known_models):
            auto_swap(e, requested)  # a failed swap leaves the previous model serving this request
        if not e.ready.is_set() or e.swapping:
            return self._not_loaded()
        if e.peer_lost.is_set():
            # The head's first collective blocks on the missing worker: the request hangs, /health stays 200.
            log("request waiting for a worker rank that is gone (hangs until the worker is back)")
            while not e.stopping.wait(0.5):
                pass
            self.close_connection = True
            return None
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return self._send_json(400, error_body("invalid_request_error", "messages must be a non-empty list"))
            texts = [message_text(m.get("content")) for m in msgs if isinstance(m, dict)]
            users = [message_text(m.get("content")) for m in msgs
                     if isinstance(m, dict) and m.get("role") == "user"]
            last_user = users[-1] if users else ""
        else:
            prompt = body.get("prompt", "")
            texts = [" ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)]
            last_user = texts[0]
        words = " ".join(texts).split()
        n_prompt = len(words)
        plan = plan_generation(e, body, chat, last_user)
        if n_prompt + plan.n_tokens > e.args.max_seq_len:
            return self._send_json(400, error_body(
                "invalid_request_error",
                f"prompt ({n_prompt} tokens) + max_tokens exceeds --max-seq-len {e.args.max_seq_len}",
                "context_length_exceeded"))
        cached = e.prefix_lookup(words)
        ttft = e.ttft_s * (1.0 - 0.9 * cached)
        with e.metrics.lock:
            e.metrics.active += 1
            e.request_seq += 1
        t0 = time.monotonic()
        status = "200"
        first = [None]
        try:
            if body.get("stream"):
                self._stream(body, chat, plan, n_prompt, ttft, first)
            else:
                self._complete(body, chat, plan, n_prompt, ttft, first)
        except (BrokenPipeError, ConnectionResetError):
            status = "499"  # client went away mid-stream
        finally:
            elapsed = time.monotonic() - t0
            m = e.metrics
            with m.lock:
                m.active -= 1
                key = (e.served_name, status)
                m.requests_total[key] = m.requests_total.get(key, 0) + 1
                m.prompt_tokens += n_prompt
                m.generation_tokens += plan.n_tokens
                m.decoded_tokens += plan.n_tokens
                if plan.tool_calls:
                    m.tool_calls += len(plan.tool_calls)
                if any(f in e.args.flags for f in ("speculative", "self-speculative", "ngram-speculative", "dflash")):
                    k = e.args.get("num-drafts", "1")
                    for i in range(plan.n_tokens):
                        outcome = "rejected" if i % 4 == 3 else "accepted"
                        m.spec_verify[(k, outcome)] = m.spec_verify.get((k, outcome), 0) + 1
                        if outcome == "rejected":
                            m.decoded_tokens += 1
            if first[0] is not None:
                e.metrics.observe_ttft(e.served_name, first[0])
            log(f"request model={e.served_name} prompt_tokens={n_prompt} generated_tokens={plan.n_tokens} "
                f"ttft_ms={(first[0] or 0) * 1000:.1f} elapsed_ms={elapsed * 1000:.1f} "
                f"tools={len(plan.tool_calls)} status={status}")

    def _usage(self, plan: Plan, n_prompt: int) -> dict:
        return {"prompt_tokens": n_prompt, "completion_tokens": plan.n_tokens,
                "total_tokens": n_prompt + plan.n_tokens,
                "completion_tokens_details": {"reasoning_tokens": len(plan.reasoning)}}

    def _complete(self, body: dict, chat: bool, plan: Plan, n_prompt: int, ttft: float, first: list) -> None:
        e = self.engine
        t0 = time.monotonic()
        e.sleep(ttft)
        first[0] = time.monotonic() - t0
        e.sleep(e.itl_s * max(plan.n_tokens - 1, 0))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if chat:
            message: dict = {"role": "assistant", "content": "".join(plan.content) if not plan.tool_calls else None}
            if plan.reasoning:
                message["reasoning_content"] = "".join(plan.reasoning)
            if plan.tool_calls:
                message["tool_calls"] = [{k: v for k, v in tc.items() if k != "index"} for tc in plan.tool_calls]
            choice = {"index": 0, "message": message, "finish_reason": plan.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": "".join(plan.content), "finish_reason": plan.finish_reason}
            obj = "text_completion"
        self._send_json(200, {"id": rid, "object": obj, "created": int(time.time()),
                              "model": e.served_name, "choices": [choice],
                              "usage": self._usage(plan, n_prompt)})

    def _chunk(self, data: str) -> None:
        raw = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        self.wfile.flush()

    def _stream(self, body: dict, chat: bool, plan: Plan, n_prompt: int, ttft: float, first: list) -> None:
        e = self.engine
        t0 = time.monotonic()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def event(choices: list, usage: dict | None = None) -> None:
            payload: dict = {"id": rid, "object": obj, "created": created, "model": e.served_name,
                             "choices": choices}
            if include_usage:
                payload["usage"] = usage
            self._chunk("data: " + json.dumps(payload) + "\n\n")

        steps: list[dict] = []
        for tok in plan.reasoning:
            steps.append({"reasoning_content": tok})
        for tok in plan.content:
            steps.append({"content": tok})
        for tc in plan.tool_calls:
            steps.append({"tool_calls": [tc]})
        if e.sleep(ttft):
            steps = []
        for i, delta in enumerate(steps):
            if i == 0:
                first[0] = time.monotonic() - t0
                if chat:
                    delta = {"role": "assistant", **delta}
            elif e.sleep(e.itl_s):
                break
            if chat:
                event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
            else:
                event([{"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": None}])
        if chat:
            event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": plan.finish_reason}])
        else:
            event([{"index": 0, "text": "", "logprobs": None, "finish_reason": plan.finish_reason}])
        if include_usage:
            event([], self._usage(plan, n_prompt))
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def make_handler(engine: Engine) -> type:
    return type("BoundHandler", (Handler,), {"engine": engine})


def serve_config(e: Engine) -> dict:
    a = e.args
    return {
        "test_double": True,
        "engine_version": VERSION_LINE,
        "binary_sha256": self_digest(),
        "argv": a.argv,
        "args_sha256": a.args_digest(),
        "model": e.model,
        "served_model_name": e.served_name,
        "positional": a.positional,
        "flags": a.flags,
        "bind": a.bind,
        "port": a.port,
        "rank": a.rank,
        "world_size": a.world_size,
        "env": e.env_present,
        "faults": sorted(e.faults),
        "started_at": e.started,
    }


def auto_swap(e: Engine, new_model: str) -> bool:
    """--auto-swap: replace the served model in place. The socket stays bound; 503 while loading."""
    with e.swap_lock:
        if new_model in (e.model, e.served_name):
            return True
        old = (e.model, e.served_name)
        e.swapping = True
        log(f"swap: {e.model} -> {new_model} (host/port stay as bound)")
        try:
            # in-flight requests finish on the old model; new ones get 503 until done
            t0 = time.monotonic()
            log(f"loading {new_model}")
            if e.sleep(e.swap_delay):
                return False
            if "swap-fail" in e.faults:
                log(f"error: load of {new_model} failed; restoring {old[0]}")
                log(f"loaded {e.tensors} tensors in {time.monotonic() - t0:.1f}s")
                log(f"swap failed: serving {old[0]}")
                return False
            log(f"loaded {e.tensors} tensors in {time.monotonic() - t0:.1f}s")
            e.model = e.served_name = new_model
            log(f"swap complete: serving {new_model}")
            return True
        finally:
            e.swapping = False


# ----------------------------------------------------------------------------------- rendezvous


class Rendezvous:
    """Multi-rank start-up over a real TCP rendezvous (stdlib sockets), the way ``met`` does it.

    The head (rank 0) listens on --master-addr:--master-port (that very address: a master-addr
    that is not one of the head's own addresses fails to bind, as NCCL's would) and waits for
    world-1 workers; each worker connects with retries and sends one JSON line: its rank, its
    rank-symmetric serve flags (--speculative, --num-drafts, --mtp-quantization) and its
    NCCL_SOCKET_IFNAME. The head compares them with its own:

    - flags differ: the head logs the mismatch, tells that worker, and keeps waiting; the worker
      prints the engine's "SSM intermediate-buffer error" and exits 1 (the book's symmetry rule);
    - NCCL_SOCKET_IFNAME differs: every rank prints "all ranks ready" and then hangs (NCCL init
      never completes, no readiness marker): the book's "stuck at all ranks ready";
    - nobody (acceptable) joined within DOUBLE_RENDEZVOUS_TIMEOUT seconds (default 60): the head,
      and a worker that cannot reach the head, print "rendezvous timeout" and exit 1.

    After the rendezvous the head keeps each worker's connection; when one drops, the head keeps
    answering /health 200 but inference requests hang (the book: "health 200 but requests hang —
    the worker failed to come up"). DOUBLE_RANK_OVERRIDE (e.g. ``num-drafts=3`` or
    ``NCCL_SOCKET_IFNAME=eth9``) changes what THIS rank reports at the rendezvous, standing in for
    an engine build whose own defaults (MODEL.toml) replace a flag, or a hand-started rank.
    """

    SYMMETRIC = ("speculative", "num-drafts", "mtp-quantization")
    CONNECT_ATTEMPT_S = 2.0
    RETRY_PAUSE_S = 0.5

    def __init__(self, e: Engine):
        self.e = e
        a = e.args
        self.rank, self.world = a.rank, a.world_size
        self.host = a.get("master-addr", "127.0.0.1").strip("[]")
        self.port = a.int("master-port", 29500)
        self.master = format_addr(self.host, self.port)
        self.timeout_s = env_float("DOUBLE_RENDEZVOUS_TIMEOUT", 60.0)
        self.tag = f"rank {self.rank}/{self.world}"
        self.listener: socket.socket | None = None
        self.peers: list[socket.socket] = []
        self.closing = threading.Event()  # our own close(): a watcher's link ending then is no loss to report
        self.identity = self._identity()

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    def _identity(self) -> dict:
        a = self.e.args
        flags: dict = {"speculative": "speculative" in a.flags,
                       "num-drafts": a.get("num-drafts", "1"),
                       "mtp-quantization": a.get("mtp-quantization", "bf16")}
        ifname = os.environ.get("NCCL_SOCKET_IFNAME", "")
        for item in os.environ.get("DOUBLE_RANK_OVERRIDE", "").split(","):
            key, eq, value = item.strip().partition("=")
            if not eq:
                continue
            if key == "NCCL_SOCKET_IFNAME":
                ifname = value
            elif key == "speculative":
                flags[key] = value.lower() in ("1", "true", "yes", "on")
            elif key in self.SYMMETRIC:
                flags[key] = value
            else:
                raise UsageError(f"error: DOUBLE_RANK_OVERRIDE: unknown key {key!r} "
                                 f"(known: {', '.join(self.SYMMETRIC)}, NCCL_SOCKET_IFNAME)")
        return {"rank": self.rank, "world": self.world, "flags": flags, "ifname": ifname,
                "model": a.model}

    # ---- head
    def listen(self) -> None:
        """Head: bind the rendezvous address before loading (workers may come early)."""
        if self.world <= 1 or not self.is_head:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(8)
        except OSError as exc:
            sock.close()
            raise StartupFailure(f"error: {self.tag} (head): cannot listen for the rendezvous on {self.master}: "
                                 f"{exc.strerror or exc} (--master-addr must be one of this node's addresses)"
                                 ) from None
        sock.settimeout(0.25)
        self.listener = sock
        log(f"{self.tag} (head): waiting for {self.world - 1} worker(s) on {self.master}")

    def _describe(self, flags: dict) -> str:
        return " ".join(f"--{k} {v}" if k != "speculative" else ("--speculative" if v else "(no --speculative)")
                        for k, v in flags.items())

    def _head_join(self) -> bool:
        assert self.listener is not None
        if "rendezvous-timeout" in self.e.faults:
            if self.e.sleep(min(self.e.ready_delay, 1.0)):
                return False
            raise StartupFailure(f"error: {self.tag}: rendezvous timeout after {self.timeout_s:g}s "
                                 f"(master {self.master} unreachable or port blocked)")
        deadline = time.monotonic() + self.timeout_s
        joined: dict[int, dict] = {}
        while len(joined) < self.world - 1:
            if self.e.stopping.is_set():
                return False
            if time.monotonic() > deadline:
                raise StartupFailure(f"error: {self.tag} (head): rendezvous timeout after {self.timeout_s:g}s: "
                                     f"{len(joined)} of {self.world - 1} worker(s) joined on {self.master} "
                                     "(a worker never came up, cannot reach the master, or the port is blocked)")
            try:
                conn, peer = self.listener.accept()
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                continue
            hello = self._read_hello(conn)
            if hello is None:
                conn.close()
                continue
            rank = int(hello.get("rank", -1))
            mine, theirs = self.identity["flags"], hello.get("flags") or {}
            differ = [k for k in self.SYMMETRIC if mine.get(k) != theirs.get(k)]
            if differ or not 0 < rank < self.world or rank in joined:
                why = (f"rank {rank} is out of range or already joined" if not differ else
                       f"MTP flags differ: rank {rank} has {self._describe({k: theirs.get(k) for k in differ})}, "
                       f"the head has {self._describe({k: mine.get(k) for k in differ})}")
                log(f"{self.tag} (head): refusing rank {rank} from {peer[0]}: {why}; still waiting")
                self._send(conn, {"ok": False, "error": "flags" if differ else "rank", "detail": why,
                                  "head_flags": mine})
                conn.close()
                continue
            log(f"{self.tag} (head): rank {rank} joined from {peer[0]} (NCCL_SOCKET_IFNAME="
                f"{hello.get('ifname') or '-'})")
            joined[rank] = hello
            self.peers.append(conn)
        ifnames = {self.identity["ifname"]} | {h.get("ifname") for h in joined.values()}
        stuck = len(ifnames) > 1
        for conn in self.peers:
            self._send(conn, {"ok": True, "stuck": stuck})
        log(f"{self.tag}: all ranks ready")
        if stuck:
            # NCCL's ncclCommInitRank never completes when the ranks use different interfaces.
            while not self.e.stopping.wait(0.5):
                pass
            return False
        for rank, conn in zip(sorted(joined), self.peers):
            threading.Thread(target=self._watch_peer, args=(rank, conn), daemon=True).start()
        return True

    def _watch_peer(self, rank: int, conn: socket.socket) -> None:
        conn.settimeout(None)
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        if not self.e.stopping.is_set() and not self.closing.is_set():
            self.e.peer_lost.set()
            log(f"{self.tag} (head): lost rank {rank} (connection closed); requests will hang until it is back")

    # ---- worker
    def _worker_join(self) -> bool:
        log(f"{self.tag} (worker): connecting to master {self.master}")
        if "rendezvous-timeout" in self.e.faults:
            if self.e.sleep(min(self.e.ready_delay, 1.0)):
                return False
            raise StartupFailure(f"error: {self.tag}: rendezvous timeout after {self.timeout_s:g}s "
                                 f"(master {self.master} unreachable or port blocked)")
        deadline = time.monotonic() + self.timeout_s
        last_error = "no answer"
        while True:
            if self.e.stopping.is_set():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                raise StartupFailure(f"error: {self.tag} (worker): rendezvous timeout after {self.timeout_s:g}s: "
                                     f"master {self.master} unreachable or port blocked ({last_error})")
            try:
                conn = socket.create_connection((self.host, self.port), timeout=min(self.CONNECT_ATTEMPT_S, left))
            except OSError as exc:
                last_error = exc.strerror or str(exc)
                if self.e.sleep(min(self.RETRY_PAUSE_S, max(left, 0))):
                    return False
                continue
            self._send(conn, self.identity)
            conn.settimeout(None)
            answer = self._read_line(conn, waiting=True)
            if answer is None:
                conn.close()
                last_error = "the master closed the connection"
                if self.e.sleep(self.RETRY_PAUSE_S):
                    return False
                continue
            if not answer.get("ok"):
                conn.close()
                if answer.get("error") == "flags":
                    raise StartupFailure(
                        f"error: {self.tag} (worker): SSM intermediate-buffer error: the head's MTP verify step "
                        f"found no intermediate buffers on this rank ({answer.get('detail')}); head and worker "
                        "must use identical --speculative, --mtp-quantization, --num-drafts")
                raise StartupFailure(f"error: {self.tag} (worker): the master refused this rank: "
                                     f"{answer.get('detail')}")
            log(f"{self.tag}: all ranks ready")
            if answer.get("stuck"):
                while not self.e.stopping.wait(0.5):
                    pass
                conn.close()
                return False
            if "worker-drop" in self.e.faults:
                log(f"{self.tag} (worker): dropping the link to the master (DOUBLE_FAULT=worker-drop)")
                conn.close()
                return True
            self.peers.append(conn)
            threading.Thread(target=self._watch_head, args=(conn,), daemon=True).start()
            return True

    def _watch_head(self, conn: socket.socket) -> None:
        # A rank that fails at start closes its peers at once, maybe before this thread runs:
        # a closed socket here is that race, not an error to print.
        try:
            conn.settimeout(None)
            while conn.recv(1024):
                pass
        except OSError:
            pass
        if not self.e.stopping.is_set() and not self.closing.is_set():
            log(f"{self.tag} (worker): lost the master {self.master} (connection closed)")

    # ---- wire
    @staticmethod
    def _send(conn: socket.socket, payload: dict) -> None:
        try:
            conn.sendall((json.dumps(payload) + "\n").encode())
        except OSError:
            pass

    def _read_line(self, conn: socket.socket, waiting: bool = False) -> dict | None:
        buf = b""
        conn.settimeout(0.5)
        deadline = time.monotonic() + (self.timeout_s + 5 if waiting else 5.0)
        while b"\n" not in buf:
            if self.e.stopping.is_set() or time.monotonic() > deadline:
                return None
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        try:
            data = json.loads(buf.split(b"\n", 1)[0])
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _read_hello(self, conn: socket.socket) -> dict | None:
        return self._read_line(conn)

    def join(self) -> bool:
        """Return False when asked to stop (or stuck until stopped); raise StartupFailure on failure."""
        if self.world <= 1:
            return True
        return self._head_join() if self.is_head else self._worker_join()

    def close(self) -> None:
        self.closing.set()
        for conn in self.peers:
            try:
                conn.close()
            except OSError:
                pass
        if self.listener is not None:
            self.listener.close()


# ----------------------------------------------------------------------------------------- main


class Signals:
    def __init__(self, e: Engine):
        self.e = e
        self.count = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._term)
        signal.signal(signal.SIGINT, self._term)

    def _term(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if "ignore-sigterm" in self.e.faults and signum == signal.SIGTERM:
            log(f"received {name}, ignoring it (DOUBLE_FAULT=ignore-sigterm)")
            return
        self.count += 1
        if self.count == 1:
            log(f"received {name}, shutting down")
        self.e.stopping.set()


def die_by_sigkill() -> None:
    log("fatal: killed during loading (DOUBLE_FAULT=exit-137)", "ERROR")
    os.kill(os.getpid(), signal.SIGKILL)
    # As PID 1 of a container the kernel drops a SIGKILL sent from inside; exit as if killed.
    time.sleep(0.2)
    os._exit(137)


def load_model(e: Engine, model: str) -> bool:
    """Print the loading lines; return False when asked to stop. Raises StartupFailure."""
    f = e.faults
    t0 = time.monotonic()
    d = e.ready_delay
    quant = e.args.get("kv-cache-dtype", "fp8")
    target = model.rsplit("/", 1)[-1].lower()
    say(f"loading {model}", f"Port: {e.args.port}")
    if "exit-at-start" in f:
        raise StartupFailure(pick(f"error: failed to start: DOUBLE_FAULT=exit-at-start for {model}",
                                  f"Error: failed to start: DOUBLE_FAULT=exit-at-start for {model}"))
    say(f"kernel target: test-double/{target}/{quant}",
        f"Selected kernel target: (test-double, {target}, {quant}) (0 modules) — quant compat: kernel={quant} "
        f"model={quant} OK")
    if "stall" in f:
        say(f"reading safetensors for {model} ...",
            "Fast-load pre-flight: 0.00 GB on-disk, 1.3x = 0.00 GB peak, 0.00 GB free (test double)")
        while not e.stopping.wait(0.5):
            pass
        return False
    if e.sleep(d * 0.4):
        return False
    if "exit-137" in f:
        die_by_sigkill()
    if "loaded-zero" in f:
        say("loaded 0 tensors in 0.1s", None)
        raise StartupFailure(pick(f"error: no tensors loaded for {model}: the HF cache is empty or the path is wrong "
                                  "(check HF_HUB_CACHE / the cache mount)",
                                  "Error: Snapshot '0000000' has no weight files (metadata-only)"))
    say(f"loaded {e.tensors} tensors in {time.monotonic() - t0:.1f}s", f"Fast-loaded {e.tensors} weight tensors")
    if "oom" in f:
        if today_format():
            for n in (1, 2, 3):
                log(f"OOM watchdog: GPU free memory critically low: 1500 MB (threshold: 2048 MB) [{n}/3]", "ERROR")
            raise StartupFailure("OOM watchdog: 3 consecutive readings below threshold. Terminating to prevent "
                                 "system freeze.")
        raise StartupFailure("error: out of memory while allocating the KV cache pool; lower "
                             "--gpu-memory-utilization (0.85) or --max-seq-len")
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max(e.args.max_batch_size, 1)]
    for b in batches:
        if e.sleep(d * 0.5 / len(batches)):
            return False
        say(f"captured graph for batch={b}", None)  # today's engine prints no such line
    tokens = e.args.max_seq_len * max(e.args.max_batch_size, 1)
    say(None, f"KV cache: 0.0 GB total x 90% util = 0.0 GB budget; 0.0 GB pre-KV + 0.0 GB reserve -> 0.0 GB for "
              f"KV -> {tokens} max KV tokens (test double)")
    if "never-ready" in f:
        n = 0
        while not e.sleep(0.5):
            n += 1
            log(f"warming up: autotuning kernels (step {n})")
        return False
    if "slow-ready" in f:
        remaining = d - (time.monotonic() - t0)
        if remaining > 0 and e.sleep(remaining):
            return False
    if "oom-after-ready" in f:
        log(watchdog_reading(1), "ERROR")  # field logs: the first reading precedes the ready line
    return True


def watchdog_reading(n: int) -> str:
    return f"OOM watchdog: GPU free memory critically low: 1350 MB (threshold: 2048 MB) [{n}/3]"


def die_of_the_watchdog(e: Engine) -> bool:
    """After the ready line: two more low readings a second apart, then the engine's own exit. False if stopped."""
    for n in (2, 3):
        if e.sleep(1.0):
            return False
        log(watchdog_reading(n), "ERROR")
    log("OOM watchdog: 3 consecutive readings below threshold. Terminating to prevent system freeze.", "ERROR")
    return True


def pick(book: str, today: str) -> str:
    return book if LOG["format"] == "book" else today


def run_serve(argv: list[str]) -> int:
    env_present = check_environment(dict(os.environ))
    args = ServeArgs(argv)
    if args.flags.get("help"):
        log("Usage: met serve <MODEL> [--port N] [--bind ADDR] [OPTIONS]   (metrale test double)")
        return 0
    faults = parse_faults(os.environ.get("DOUBLE_FAULT", ""))
    e = Engine(args, faults, env_present)
    sig = Signals(e)
    sig.install()
    rdv = Rendezvous(e)
    say(f"{VERSION_LINE} starting: rank {args.rank}/{args.world_size}, model {args.model}",
        f"Metrale Engine starting... ({VERSION_LINE}: rank {args.rank}/{args.world_size}, model {args.model})")

    if not rdv.is_head:
        # worker: no HTTP; join, load, then stay silent until told to stop
        try:
            if not rdv.join() or not load_model(e, args.model):
                return shutdown(e, None)
            log(f"rank {args.rank}/{args.world_size} (worker): ready; the head serves HTTP")
            while not e.stopping.wait(0.5):
                pass
            return shutdown(e, None)
        finally:
            rdv.close()

    # The book's engine bound its HTTP port before loading (503 until ready); today's binds after the
    # model is loaded (connection refused until then), so /health is 200 from its first answer.
    server = bind_server(e) if e.http_bind == "early" else None
    try:
        rdv.listen()
    except StartupFailure:
        if server is not None:
            server.server_close()
        raise
    if server is not None:
        serve_in_background(server)
    try:
        if not load_model(e, args.model) or not rdv.join():
            rdv.close()
            return shutdown(e, server)
        if "gpu-fault" in faults:
            e.fault_reason = os.environ.get("DOUBLE_FAULT_REASON", "").strip() or DEFAULT_FAULT_REASON
            log(f"GPU fault latched: {e.fault_reason}; /health answers 503 faulted", "ERROR")
        else:
            say(None, exposure_line(args.bind, args.port), "WARN" if args.bind in ("0.0.0.0", "::", "[::]") else "INFO")
            e.ready_at = time.time()  # before /health can answer 200 (the server may not even be bound yet)
            e.ready.set()
        if server is None:
            server = bind_server(e)
            serve_in_background(server)
    except StartupFailure:
        rdv.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        raise
    if e.fault_reason is None:
        say(f"Listening on {format_addr(args.bind, args.port)}",
            None if LOG["format"] == "silent" else ready_line(args.bind, args.port, e.served_name))
        if LOG["format"] == "book":
            if args.bind in ("127.0.0.1", "localhost", "::1"):
                log(f"bind {args.bind} is loopback-only: other machines cannot reach this server "
                    "(pass --bind 0.0.0.0 to accept LAN clients)")
            elif args.bind in ("0.0.0.0", "::", "[::]"):
                log(f"WARNING: bound to {args.bind}: the API is exposed to every machine on the LAN; "
                    "use --require-auth or a firewall")
    if "oom-after-ready" in faults and die_of_the_watchdog(e):
        rdv.close()
        server.shutdown()
        server.server_close()
        return 1
    while not e.stopping.wait(0.5):
        pass
    rdv.close()
    return shutdown(e, server)


def serve_in_background(server: ThreadingHTTPServer) -> None:
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True).start()


def ready_line(bind: str, port: int, model: str) -> str:
    """Today's ready line: a wildcard bind is printed as 127.0.0.1, an IPv6 literal bracketed."""
    host = bind.strip("[]")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"Server live and ready at {format_addr(host, port)} running {model}"


def exposure_line(bind: str, port: int) -> str | None:
    host = bind.strip("[]")
    if host in ("0.0.0.0", "::"):
        return (f"Metrale Engine is listening on {format_addr(host, port)} — reachable from any host "
                "on the network. If this machine is on a shared LAN or has a public IP, pass --bind 127.0.0.1 (or "
                "set --require-auth and a real firewall) before accepting traffic.")
    if host in ("127.0.0.1", "localhost", "::1"):
        return ("API reachable only from this machine (loopback). To expose on the LAN pass --bind 0.0.0.0; "
                "combine with --require-auth and --auth-tokens-file for non-trusted networks.")
    return None


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_server(e: Engine) -> ThreadingHTTPServer:
    host = e.args.bind.strip("[]")

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    try:
        return Server((host, e.args.port), make_handler(e))
    except OSError as exc:
        raise StartupFailure(f"error: failed to bind {format_addr(e.args.bind, e.args.port)}: "
                             f"{exc.strerror or exc}") from None


def shutdown(e: Engine, server: ThreadingHTTPServer | None) -> int:
    e.stopping.set()
    if server is not None:
        server.shutdown()
        server.server_close()
    say("shutdown complete", "Shutdown complete")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        fmt = os.environ.get("DOUBLE_LOG_FORMAT", "").strip() or "tracing"
        if fmt not in LOG_FORMATS:
            LOG["format"] = "book"
            raise UsageError(f"error: invalid value {fmt!r} for DOUBLE_LOG_FORMAT ({', '.join(LOG_FORMATS)})")
        LOG["format"] = fmt
        LOG["ansi"] = os.environ.get("DOUBLE_LOG_ANSI", "").strip() in ("1", "true", "yes")
        if not argv or argv[0] in ("-h", "--help", "help"):
            log(f"{VERSION_LINE}\nUsage: met serve <MODEL> [OPTIONS] | met --version")
            return 0 if argv else 2
        if argv[0] in ("--version", "-V", "version"):
            log(VERSION_LINE)
            return 0
        if argv[0] == "serve":
            return run_serve(argv)
        raise UsageError(f"error: unrecognized subcommand '{argv[0]}' (the test double knows: serve, --version)")
    except UsageError as exc:
        log(str(exc), "ERROR")
        return 2
    except StartupFailure as exc:
        log(str(exc), "ERROR")
        return 1


if __name__ == "__main__":
    sys.exit(main())
