"""Characterisation of Hugging Face `transformers serve`: what an OpenAI-compatible client meets there.

These pin behaviour that metralectl's benchmark client must cope with (tests/realengines/README.md
lists it). They are about the server, not about us: when a transformers upgrade changes one, the
test fails and the README and the client get revisited. Versions checked: 5.24.0 (CI's pin), 5.17.0
(the H200's) and 5.4.0 (the last release before the serving rewrite in 5.5), the last two through
METRALECTL_TFSERVE_PYTHON.
"""

from __future__ import annotations

import asyncio
import ast
import json
import re
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.realengines.sse_probe import Stream, apost_stream, post_stream
from tests.realengines.transformers_serve import MODEL_ID, TfServe, _version_tuple

pytestmark = pytest.mark.integration

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def legacy(srv: TfServe) -> bool:
    """Before 5.5 `serve` was one module with other rules (no usage, no /v1/completions, ...)."""
    return _version_tuple(srv.versions["transformers"]) < (5, 5)


def chat(srv: TfServe, **extra: object) -> dict[str, object]:
    return {"model": srv.model, "messages": FRANCE, "max_tokens": 12, "stream": True, **extra}


@pytest.fixture()
def client(tfserve: TfServe) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tfserve.url, timeout=120) as c:
        yield c


def refused_names(detail: str) -> set[str]:
    """The field names in "Unexpected fields in the request: {'a', 'b'}" (a Python set's repr)."""
    m = re.search(r"(\{.*\})\s*$", detail)
    assert m, detail
    return set(ast.literal_eval(m.group(1)))


@pytest.mark.parametrize("fields", [{"ignore_eos": True}, {"min_tokens": 12}, {"ignore_eos": True, "min_tokens": 12}])
def test_non_openai_sampling_fields_are_refused_with_422_naming_them(tfserve: TfServe, client: httpx.Client,
                                                                     fields: dict[str, object]) -> None:
    s = post_stream(client, "/v1/chat/completions", chat(tfserve, **fields))
    assert s.status == 422, s.raw
    assert s.headers["content-type"] == "application/json"
    body = s.body_json()
    assert list(body) == ["detail"] and isinstance(body["detail"], str), body
    prefix = "Unexpected keys in the request: " if legacy(tfserve) else "Unexpected fields in the request: "
    assert body["detail"].startswith(prefix), body
    assert refused_names(body["detail"]) == set(fields)  # a set's repr: the order varies from run to run


def test_stream_ends_after_the_finish_chunk_without_done(tfserve: TfServe, client: httpx.Client) -> None:
    s = post_stream(client, "/v1/chat/completions", chat(tfserve))
    assert s.status == 200 and s.headers["content-type"].startswith("text/event-stream")
    assert not s.done_sentinel and b"[DONE]" not in s.raw
    chunks = s.chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}  # a role-only chunk opens the stream
    finishing = [i for i, c in enumerate(chunks) if c["choices"][0].get("finish_reason")]
    assert finishing == [len(chunks) - 1], "exactly one chunk has finish_reason, and it is the last"
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert s.raw.endswith(b"}\n\n")  # the server closes the body right after the finish chunk


def test_usage_comes_on_the_finish_chunk_with_or_without_stream_options(tfserve: TfServe,
                                                                       client: httpx.Client) -> None:
    plain = post_stream(client, "/v1/chat/completions", chat(tfserve))
    asked = post_stream(client, "/v1/chat/completions",
                        chat(tfserve, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    if legacy(tfserve):
        # 5.4 without --input-validation: stream_options passes unchecked, and no chunk ever has usage
        assert asked.status == 200
        assert not any("usage" in c for c in plain.chunks + asked.chunks)
        return
    assert asked.status == 200  # accepted, and ignored: the server logs that it ignores it
    for s in (plain, asked):
        with_usage = [i for i, c in enumerate(s.chunks) if "usage" in c]
        assert with_usage == [len(s.chunks) - 1], "usage rides on the finish chunk only (never per chunk)"
        usage = s.chunks[-1]["usage"]
        assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert plain.chunks[-1]["usage"] == asked.chunks[-1]["usage"]
    assert "Ignoring unsupported fields in the request: {'stream_options'}" in tfserve.log_text()


def test_legacy_with_input_validation_refuses_stream_options(tfserve: TfServe,
                                                            tfserve_factory: Callable[..., TfServe]) -> None:
    if not legacy(tfserve):
        pytest.skip("5.5+ has no --input-validation: stream_options is always accepted (and ignored)")
    srv = tfserve_factory(extra_args=["--input-validation"])
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        s = post_stream(c, "/v1/chat/completions", chat(srv, stream_options={"include_usage": True}))
    assert s.status == 422 and s.body_json() == {"detail": "Unused fields in the request: {'stream_options'}"}


def test_prompt_tokens_count_the_chat_template(tfserve: TfServe, client: httpx.Client) -> None:
    if legacy(tfserve):
        pytest.skip("no usage before 5.5")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(tfserve.model_dir / "tokenizer.json"))
    rendered = f"<s><|user|>\n{FRANCE[0]['content']}</s>\n<|assistant|>\n"
    s = post_stream(client, "/v1/chat/completions", chat(tfserve))
    assert s.chunks[-1]["usage"]["prompt_tokens"] == len(tok.encode(rendered, add_special_tokens=False).ids)


@pytest.mark.parametrize("max_tokens", [1, 7, 40])
def test_max_tokens_is_respected_and_chunks_may_be_fewer_than_tokens(tfserve: TfServe, client: httpx.Client,
                                                                     max_tokens: int) -> None:
    s = post_stream(client, "/v1/chat/completions", chat(tfserve, max_tokens=max_tokens))
    content = [c for c in s.chunks if c["choices"][0]["delta"].get("content")]
    assert s.chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert 1 <= len(content) <= max_tokens  # special tokens the model emits count but stream no text
    if not legacy(tfserve):
        assert s.chunks[-1]["usage"]["completion_tokens"] == max_tokens
    whole = client.post("/v1/chat/completions", json=chat(tfserve, max_tokens=max_tokens, stream=False))
    if legacy(tfserve):
        return
    assert whole.status_code == 200
    message = whole.json()["choices"][0]["message"]["content"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == message  # greedy: same text


def test_max_completion_tokens(tfserve: TfServe, client: httpx.Client) -> None:
    body = chat(tfserve, max_completion_tokens=5)
    del body["max_tokens"]
    s = post_stream(client, "/v1/chat/completions", body)
    version = _version_tuple(tfserve.versions["transformers"])
    if version >= (5, 20):
        assert s.status == 200 and s.chunks[-1]["usage"]["completion_tokens"] == 5
    elif not legacy(tfserve):
        # 5.17 ignores it (logged as unsupported) and generates up to the server's default of 1024 tokens
        assert s.status == 200 and s.chunks[-1]["usage"]["completion_tokens"] > 5
        assert "max_completion_tokens" in tfserve.log_text()
    else:
        assert s.status == 200


def test_eos_ends_a_stream_with_stop_and_float_logit_bias_reaches_it(tfserve: TfServe,
                                                                     client: httpx.Client) -> None:
    if legacy(tfserve):
        pytest.skip("5.4 hangs on logit_bias (the generation thread dies; the stream never ends)")
    s = post_stream(client, "/v1/chat/completions", chat(tfserve, logit_bias={str(tfserve.eos_token_id): 100.0}))
    assert s.chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert s.chunks[-1]["usage"]["completion_tokens"] == 1  # the EOS counts as a completion token
    assert not any(c["choices"][0]["delta"].get("content") for c in s.chunks)
    s = post_stream(client, "/v1/chat/completions", chat(tfserve, logit_bias={str(tfserve.eos_token_id): -100.0}))
    assert s.chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_integer_logit_bias_fails_inside_a_200_stream(tfserve: TfServe, client: httpx.Client) -> None:
    if legacy(tfserve):
        pytest.skip("5.4 hangs on logit_bias (the generation thread dies; the stream never ends)")
    s = post_stream(client, "/v1/chat/completions", chat(tfserve, logit_bias={str(tfserve.eos_token_id): 100}))
    assert s.status == 200
    last = json.loads(s.data[-1])
    assert list(last) == ["error"] and "sequence_bias" in last["error"], last  # {"error": "..."}: a bare string
    assert not any(c.get("choices", [{}])[0].get("finish_reason") for c in s.chunks)


def test_random_weights_stop_early_on_some_prompts_unless_eos_is_suppressed(
        tfserve: TfServe, tfserve_factory: Callable[..., TfServe]) -> None:
    """Greedy decoding on random weights: a few prompts reach </s> before max_tokens (finish_reason
    "stop", fewer tokens than asked). The eos="suppressed" model never does: ignore_eos by construction."""
    stopped = None
    with httpx.Client(base_url=tfserve.url, timeout=120) as c:
        for i in range(40):
            body = chat(tfserve, max_tokens=64, messages=[{"role": "user", "content": f"stream {i}"}])
            s = post_stream(c, "/v1/chat/completions", body)
            if s.chunks[-1]["choices"][0]["finish_reason"] == "stop":
                stopped = body
                if not legacy(tfserve):
                    assert s.chunks[-1]["usage"]["completion_tokens"] < 64
                break
        assert stopped is not None, "no prompt of 40 stopped early: the EOS path went untested"
        if not legacy(tfserve):
            # transformers' own field (a JSON string replacing the model's generation config) is its
            # min_tokens: the same prompt now runs to max_tokens
            forced = post_stream(c, "/v1/chat/completions",
                                 {**stopped, "generation_config": json.dumps({"min_new_tokens": 64})})
            assert forced.chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert forced.chunks[-1]["usage"]["completion_tokens"] == 64
    srv = tfserve_factory(eos="suppressed")
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        s = post_stream(c, "/v1/chat/completions", {**stopped, "model": srv.model})
    assert s.chunks[-1]["choices"][0]["finish_reason"] == "length"
    if not legacy(tfserve):
        assert s.chunks[-1]["usage"]["completion_tokens"] == 64


def test_model_names(tfserve: TfServe, client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [MODEL_ID]
    s = post_stream(client, "/v1/chat/completions", chat(tfserve))
    assert {c["model"] for c in s.chunks} == {MODEL_ID + "@main"}  # not the id /v1/models gave
    body = chat(tfserve)
    del body["model"]
    # 5.5+: the pinned model is the default; 5.4 answers 500 (text/plain "Internal Server Error")
    assert post_stream(client, "/v1/chat/completions", body).status == (500 if legacy(tfserve) else 200)
    with httpx.Client(base_url=tfserve.url, timeout=120) as fresh:  # 5.4 drops the connection after its 500
        other = post_stream(fresh, "/v1/chat/completions", chat(tfserve, model="someone/else"))
    if legacy(tfserve):
        assert other.status == 200  # 5.4's --force-model overrides whatever the request names
    else:
        assert other.status == 400
        assert other.body_json() == {"detail": f"Server is pinned to '{MODEL_ID}'; requested 'someone/else'."}


def test_models_listing_of_a_directory_served_model(tfserve: TfServe,
                                                    tfserve_factory: Callable[..., TfServe]) -> None:
    srv = tfserve_factory(layout="dir")
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        listed = c.get("/v1/models").json()["data"]
    version = _version_tuple(srv.versions["transformers"])
    if version >= (5, 20):
        assert [(m["id"], m["owned_by"]) for m in listed] == [(srv.model, "local")]
    else:
        assert listed == []  # /v1/models lists the HF hub cache, not what is served


def test_request_ids(tfserve: TfServe, client: httpx.Client) -> None:
    a = post_stream(client, "/v1/chat/completions", chat(tfserve, max_tokens=2))
    b = post_stream(client, "/v1/chat/completions", chat(tfserve, max_tokens=2))
    if legacy(tfserve):
        assert a.chunks[0]["id"] == b.chunks[0]["id"] == "req_0"  # not unique across requests
    else:
        assert a.chunks[0]["id"] != b.chunks[0]["id"]
        assert a.headers["x-request-id"] == a.chunks[0]["id"]


def test_completions_endpoint_streams(tfserve: TfServe, client: httpx.Client) -> None:
    body = {"model": tfserve.model, "prompt": "The weather in the mountains", "max_tokens": 9, "stream": True}
    s = post_stream(client, "/v1/completions", body)
    if legacy(tfserve):
        assert s.status == 404
        return
    assert s.status == 200 and not s.done_sentinel
    chunks = s.chunks
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "text" in chunks[0]["choices"][0]  # no role-only opening chunk here
    finishing = [i for i, c in enumerate(chunks) if c["choices"][0].get("finish_reason")]
    assert finishing == [len(chunks) - 1] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 9
    assert refused_names(post_stream(client, "/v1/completions", {**body, "ignore_eos": True}).body_json()["detail"]) \
        == {"ignore_eos"}


def test_routes(tfserve: TfServe, client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/metrics").status_code == 404
    assert client.post("/tokenize", json={"prompt": "x"}).status_code == 404


def _switches(streams: list[Stream]) -> int:
    """How often the next content token (by receive time) belongs to another stream than the last one."""
    events = sorted((t, i) for i, s in enumerate(streams) for t in s.content_stamps())
    return sum(1 for a, b in zip(events, events[1:]) if a[1] != b[1])


async def _parallel(srv: TfServe, n: int) -> list[Stream]:
    async with httpx.AsyncClient(base_url=srv.url, timeout=300,
                                 limits=httpx.Limits(max_connections=n)) as c:
        bodies = [chat(srv, max_tokens=48, messages=[{"role": "user", "content": f"parallel stream {i}"}])
                  for i in range(n)]
        return list(await asyncio.gather(*(apost_stream(c, "/v1/chat/completions", b) for b in bodies)))


def test_eight_parallel_streams_all_finish_one_after_another(tfserve: TfServe) -> None:
    streams = asyncio.run(_parallel(tfserve, 8))
    assert [s.status for s in streams] == [200] * 8
    assert all(s.chunks[-1]["choices"][0].get("finish_reason") for s in streams)
    if legacy(tfserve):
        return  # 5.4 runs a thread per request: they interleave
    # 5.5+ runs every generate() on one inference thread: a stream's tokens start after the previous
    # one's ended, so the merged token order switches stream about n-1 times, not once per token.
    assert _switches(streams) <= 7 + 4, _switches(streams)


def test_continuous_batching_interleaves_parallel_streams(tfserve: TfServe,
                                                          tfserve_factory: Callable[..., TfServe]) -> None:
    if legacy(tfserve):
        pytest.skip("not characterised on 5.4")
    srv = tfserve_factory(extra_args=["--continuous-batching"])
    streams = asyncio.run(_parallel(srv, 8))
    assert [s.status for s in streams] == [200] * 8
    assert _switches(streams) > 40, _switches(streams)  # batched: tokens of all streams alternate
