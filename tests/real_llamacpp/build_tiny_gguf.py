"""Write a tiny random-weight Llama as a Q8_0 GGUF into a Hugging Face cache, offline and deterministically.

TEST FIXTURE for the real llama.cpp `llama-server` (tests/integration/test_llamacpp_real.py). Standalone
(stdlib + numpy + the `gguf` package, no metralectl):

    python3 tests/real_llamacpp/build_tiny_gguf.py --hf-cache DIR [--preset tiny|1b] [--json]

lays the model out the way `huggingface_hub` leaves a download, so `llama-server -hf REPO:Q8_0 --offline`
with HF_HUB_CACHE=DIR finds it as it would a user's cache:

    DIR/models--metralectl-test--tiny-llama-gguf/
        blobs/<sha256 of the file>
        snapshots/<40-hex revision>/tiny-llama-gguf-Q8_0.gguf -> ../../blobs/<sha256>
        refs/main                                  (the revision)

(llama.cpp reads refs/ for a 40-hex commit, then every file under snapshots/<commit>/, and picks the
.gguf whose name holds `Q8_0` followed by `.` or `-`.) It prints the repo id on stdout (a JSON summary
with --json). Safe to run again: the same inputs give the same bytes and nothing is rewritten.

The model (the default preset, `tiny`): llama architecture, 2 layers, hidden 64, 4 heads, FFN 128, linear
weights in Q8_0. `--preset 1b` writes the same kind of model at a size a GPU notices
(`metralectl-test/random-llama-1b-gguf`: hidden 2048, 22 layers, 32 query and 4 key/value heads, FFN
5632, ~0.97B parameters, ~1.0 GB; benchmarks/h200/run_llamacpp_cuda.sh serves it on the H200). The
tokenizer is a GPT-2-style byte-level BPE ("gpt2" / pre-tokenizer "gpt-2"): the 256 byte symbols plus
merges learned from tests/realengines/corpus.txt (ASCII prose), and ChatML control tokens with a ChatML
chat template. The output rows of every token except printable-ASCII ones are zero and the others large,
so greedy or low-temperature decoding only ever emits whole ASCII word pieces: never EOS (outputs run to
max_tokens, like a benchmark wants) and never half a UTF-8 character (which a server holds back).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "realengines" / "corpus.txt"
ORG, NAME = "metralectl-test", "tiny-llama-gguf"
REPO_ID = f"{ORG}/{NAME}"
QUANT = "Q8_0"
FILENAME = f"{NAME}-{QUANT}.gguf"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN, LAYERS, HEADS, FFN, CONTEXT, MERGES, SEED = 64, 2, 4, 128, 4096, 320, 1234


@dataclass(frozen=True)
class Shape:
    """The model's size; `name` is the repo's NAME (models--ORG--NAME) and the file's stem."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int

    @property
    def repo_id(self) -> str:
        return f"{ORG}/{self.name}"

    @property
    def filename(self) -> str:
        return f"{self.name}-{QUANT}.gguf"


TINY = Shape(NAME, HIDDEN, LAYERS, HEADS, HEADS, FFN, CONTEXT)
# TinyLlama-1.1B's body (grouped-query attention, head dim 64) over this file's small tokenizer
PRESETS = {"tiny": TINY, "1b": Shape("random-llama-1b-gguf", 2048, 22, 32, 4, 5632, 4096)}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# GPT-2's pre-tokenizer, narrowed to ASCII (the corpus is ASCII): contractions, words, numbers, punctuation, spaces
PRETOKEN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def byte_symbols() -> list[str]:
    """GPT-2's byte -> printable-character table, as a list indexed by byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def train_bpe(text: str, n_merges: int) -> tuple[list[str], list[str]]:
    """Plain BPE over pre-tokenized words: the most frequent adjacent pair merges first, ties broken by the
    pair's text so every run gives the same merges. Returns (new tokens in merge order, merges "a b")."""
    sym = byte_symbols()
    words = Counter(tuple(sym[b] for b in w.encode()) for w in PRETOKEN.findall(text))
    tokens: list[str] = []
    merges: list[str] = []
    seen = set(sym)
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{a} {b}")
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return tokens, merges


@dataclass(frozen=True)
class Vocab:
    """The byte-level BPE vocabulary of the tests' GGUFs (also benchmarks/h200/make_lifecycle_models.py's)."""

    tokens: list[str]
    types: list[Any]
    merges: list[str]
    ids: dict[str, int]
    emit: np.ndarray  # tokens the model may emit: every byte of their text is printable ASCII (space included)


def bpe_vocab() -> Vocab:
    import gguf

    sym = byte_symbols()
    learned, merges = train_bpe(CORPUS.read_text(encoding="utf-8"), MERGES)
    tokens = sym + learned + SPECIAL
    types = [gguf.TokenType.NORMAL] * (len(sym) + len(learned)) + [gguf.TokenType.CONTROL] * len(SPECIAL)
    unsym = {s: b for b, s in enumerate(sym)}
    emit = np.array([t not in SPECIAL and all(0x20 <= unsym[c] < 0x7F for c in t) for t in tokens])
    return Vocab(tokens, types, merges, {t: i for i, t in enumerate(tokens)}, emit)


def add_llama_arch(writer: Any, *, name: str, context: int, hidden: int, layers: int, ffn: int, heads: int,
                   kv_heads: int, vocab_size: int, file_type: Any, head_dim: int | None = None,
                   rope_base: float = 10000.0, rms_eps: float = 1e-5) -> None:
    """A Llama's architecture keys, in the order llama.cpp's converter writes them; `head_dim` given: written
    as the key and value lengths too (a head size other than hidden / heads)."""
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim or hidden // heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(file_type)


def add_bpe_tokenizer(writer: Any, vocab: Vocab) -> None:
    """GPT-2 style byte-level BPE with ChatML control tokens and chat template."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.ids["<|endoftext|>"])
    writer.add_eos_token_id(vocab.ids["<|im_end|>"])
    writer.add_pad_token_id(vocab.ids["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def add_random_llama_tensors(writer: Any, shape: Any, vocab: Vocab, weight: Callable[[int, int, float], np.ndarray],
                             add: Callable[[str, np.ndarray], None]) -> None:
    """Every tensor of a Llama of `shape` (hidden, layers, heads, kv_heads, ffn): norms of ones, linear weights
    from `weight(rows, cols, std)` (called in a fixed order: the bytes are deterministic), written by `add`.
    The output rows of the tokens not in `vocab.emit` are exactly 0: the allowed tokens' logits spread over tens of
    units, far above them, so decoding never emits EOS or half a UTF-8 character."""
    hidden, kv_dim = shape.hidden, shape.hidden // shape.heads * shape.kv_heads
    ones = np.ones(hidden, dtype=np.float32)
    add("token_embd.weight", weight(len(vocab.tokens), hidden, 1.0))
    rows = {"attn_q": hidden, "attn_k": kv_dim, "attn_v": kv_dim, "attn_output": hidden}
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(f"blk.{i}.{part}.weight", weight(rows[part], hidden, 0.02))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        add(f"blk.{i}.ffn_gate.weight", weight(shape.ffn, hidden, 0.02))
        add(f"blk.{i}.ffn_up.weight", weight(shape.ffn, hidden, 0.02))
        add(f"blk.{i}.ffn_down.weight", weight(hidden, shape.ffn, 0.02))
    writer.add_tensor("output_norm.weight", ones)
    out = weight(len(vocab.tokens), hidden, 1.0)
    add("output.weight", out * vocab.emit[:, None].astype(out.dtype))


def llama_params(shape: Any, vocab_size: int) -> int:
    hidden, kv_dim = shape.hidden, shape.hidden // shape.heads * shape.kv_heads
    return vocab_size * hidden * 2 + shape.layers * (
        2 * hidden * hidden + 2 * kv_dim * hidden + 3 * shape.ffn * hidden + 2 * hidden) + hidden


def build_gguf(path: Path, shape: Shape = TINY, *, name: str | None = None, split_max_tensors: int = 0) -> dict[str, Any]:
    """`name`: the model's general.name (default the shape's; another name, other bytes); `split_max_tensors` > 0
    writes a split GGUF, `PATH-00001-of-0000N.gguf` and the rest next to `path`, as llama.cpp's gguf-split names them."""
    import gguf  # the test requirements install it; imported here so --help works without it

    vocab = bpe_vocab()
    rng = np.random.default_rng(SEED)
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    add_llama_arch(writer, name=name or shape.name, context=shape.context, hidden=shape.hidden, layers=shape.layers,
                   ffn=shape.ffn, heads=shape.heads, kv_heads=shape.kv_heads, vocab_size=len(vocab.tokens),
                   file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    add_bpe_tokenizer(writer, vocab)
    add_random_llama_tensors(
        writer, shape, vocab, lambda rows, cols, std: rng.normal(0.0, std, size=(rows, cols)).astype(np.float32),
        lambda name, data: writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"vocab": len(vocab.tokens), "merges": len(vocab.merges), "emittable": int(vocab.emit.sum()),
            "params": llama_params(shape, len(vocab.tokens))}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):  # the 1b preset is a GB: never all in memory twice
            digest.update(chunk)
    return digest.hexdigest()


def install(hf_cache: Path, shape: Shape = TINY) -> dict[str, Any]:
    """Build the GGUF and place it in hf_cache (HF hub layout); returns a summary."""
    repo_dir = hf_cache / f"models--{ORG}--{shape.name}"
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo_dir) as tmp:
        built = Path(tmp) / shape.filename
        stats = build_gguf(built, shape)
        sha = file_sha256(built)
        revision = hashlib.sha1(f"{shape.repo_id}@{sha}".encode()).hexdigest()  # a commit-like 40-hex id
        blob = repo_dir / "blobs" / sha
        blob.parent.mkdir(exist_ok=True)
        if not blob.exists():
            os.replace(built, blob)  # same directory tree: an atomic rename
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    link = snapshot / shape.filename
    if not link.is_symlink():
        link.symlink_to(Path("..") / ".." / "blobs" / sha)
    (repo_dir / "refs").mkdir(exist_ok=True)
    ref = repo_dir / "refs" / "main"
    if not ref.exists() or ref.read_text().strip() != revision:
        ref.write_text(revision)
    return {"repo": shape.repo_id, "quant": QUANT, "hf_arg": f"{shape.repo_id}:{QUANT}", "file": str(link),
            "revision": revision, "sha256": sha, "bytes": blob.stat().st_size, **stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-cache", required=True, type=Path, help="the HF hub cache directory (HF_HUB_CACHE)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="the model's size: tiny (the tests' default) or 1b (~0.97B parameters, ~1 GB)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of the repo id")
    args = parser.parse_args(argv)
    summary = install(args.hf_cache, PRESETS[args.preset])
    print(json.dumps(summary, indent=2) if args.json else summary["repo"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
