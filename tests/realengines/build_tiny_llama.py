"""Build a random-weight Llama checkpoint with a small BPE tokenizer, offline and deterministically.

Standalone on purpose (stdlib + torch + transformers + tokenizers, no metralectl): the tests run it
with whichever interpreter serves the model, and the H200 kit runs it on the device machine.

    python3 tests/realengines/build_tiny_llama.py --cache-root DIR [--preset tiny|h200] [--json]

prints the model directory on stdout (a JSON summary with --json). The directory is
DIR/<key>, where the key hashes this file, the corpus, the parameters and the versions of torch,
transformers and tokenizers: a machine builds each model once and a changed builder never reuses a
stale one. Builds go to a temporary directory that is renamed into place, under a lock, so two
processes asking at once build it once and nobody sees half a model.

The tokenizer is a Metaspace BPE trained on corpus.txt (ASCII prose), so prompts cost about as many
tokens as with a real model and streamed text is word pieces. A few KB cannot yield a large vocab, so
the vocab is padded to the model's size with filler words no merge reaches: a random model emits them
(they decode to plain " xyz" words) while encoding stays that of the trained merges.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
UNK, BOS, EOS, PAD = 0, 1, 2, 3
# Messages may carry OpenAI content parts; only the text parts make the prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
PRESETS: dict[str, dict[str, Any]] = {
    # ~0.1M parameters: streams hundreds of tokens per second on one CPU core.
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 4, "intermediate": 128, "vocab": 1024,
             "max_positions": 4096, "dtype": "float32"},
    # ~0.73B parameters in bf16: a model an H200 decodes at a realistic, memory-bound pace.
    "h200": {"hidden": 1536, "layers": 24, "heads": 12, "kv_heads": 12, "intermediate": 4096, "vocab": 32000,
             "max_positions": 8192, "dtype": "bfloat16"},
}
VERSION = 1  # bump to invalidate every cached model when the output format changes


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


def cache_key(params: dict[str, Any], vers: dict[str, str]) -> str:
    h = hashlib.sha256()
    for blob in (Path(__file__).read_bytes(), CORPUS.read_bytes(), json.dumps(params, sort_keys=True).encode(),
                 json.dumps(vers, sort_keys=True).encode(), str(VERSION).encode()):
        h.update(hashlib.sha256(blob).digest())
    return f"llama-{params['preset']}-tf{vers['transformers']}-{h.hexdigest()[:16]}"


def _filler(i: int) -> str:
    """The i-th filler word: 'qa', 'qb', ... in a base-26 count, prefixed to keep clear of real words."""
    letters = ""
    i += 26 * 27  # start at three letters
    while i:
        i, r = divmod(i, 26)
        letters = chr(ord("a") + r) + letters
    return "\u2581" + letters


def build_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, initial_alphabet=alphabet,
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(CORPUS.read_text(encoding="ascii").splitlines(keepends=True), trainer)
    spec = json.loads(tok.to_str())
    table: dict[str, int] = spec["model"]["vocab"]
    i = 0
    while len(table) < vocab:  # pad with filler words no merge reaches (see the module's docstring)
        word = _filler(i)
        i += 1
        if word not in table:
            table[word] = len(table)
    if len(table) != vocab or sorted(table.values()) != list(range(vocab)):
        raise SystemExit(f"tokenizer: vocab of {len(table)} ids, wanted exactly {vocab} contiguous ids")
    for i, name in enumerate(SPECIAL):
        if table.get(name) != i:
            raise SystemExit(f"tokenizer: special token {name} has id {table.get(name)}, wanted {i}")
    return Tokenizer.from_str(json.dumps(spec))


def write_tokenizer(tok: Any, out: Path, max_positions: int) -> None:
    # Written by hand, not with save_pretrained: transformers 5 names its own class in
    # tokenizer_config.json, which the transformers 4.x inside other tools (AIPerf) cannot load.
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": max_positions,
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=1) + "\n")


def build_model(params: dict[str, Any], out: Path) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=params["vocab"], hidden_size=params["hidden"], intermediate_size=params["intermediate"],
        num_hidden_layers=params["layers"], num_attention_heads=params["heads"],
        num_key_value_heads=params["kv_heads"], max_position_embeddings=params["max_positions"],
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)
    torch.manual_seed(params["seed"])
    with torch.no_grad():
        model = LlamaForCausalLM(config)  # weights from transformers' own init, on the seeded CPU generator
    model = model.to(getattr(torch, params["dtype"]))
    model.config.dtype = params["dtype"]
    gen: dict[str, Any] = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}
    if params["eos"] == "suppressed":
        gen["suppress_tokens"] = [EOS]  # every output runs to max_tokens, as ignore_eos would make it
    model.generation_config = GenerationConfig(**gen)
    model.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def build(params: dict[str, Any], out: Path) -> dict[str, Any]:
    tok = build_tokenizer(params["vocab"])
    write_tokenizer(tok, out, params["max_positions"])
    n = build_model(params, out)
    summary = {"params": params, "parameters": n, "versions": versions()}
    (out / "metralectl-build.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def ensure(cache_root: Path, params: dict[str, Any]) -> tuple[Path, bool]:
    """The cached model directory for `params`, built first when missing. (dir, built_now)."""
    key = cache_key(params, versions())
    final = cache_root / key
    if (final / "metralectl-build.json").is_file():
        return final, False
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "metralectl-build.json").is_file():  # built by another process while we waited
            return final, False
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root))
        try:
            build(params, tmp)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final, True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-root", type=Path, help="build into CACHE_ROOT/<key> once (default with --out unset)")
    ap.add_argument("--out", type=Path, help="build into this new directory instead (no cache)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--eos", choices=("natural", "suppressed"), default="natural",
                    help="natural: the model may stop at </s>; suppressed: outputs always run to max_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of the bare path")
    for name in PRESETS["tiny"]:
        ap.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                        type=str if name == "dtype" else int, help=f"override the preset's {name}")
    args = ap.parse_args(argv)
    if (args.cache_root is None) == (args.out is None):
        ap.error("give exactly one of --cache-root or --out")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(PRESETS[args.preset], preset=args.preset, eos=args.eos, seed=args.seed)
    for name in PRESETS["tiny"]:
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    if params["hidden"] % params["heads"] or params["heads"] % params["kv_heads"]:
        print(f"build_tiny_llama: hidden {params['hidden']} must divide by heads {params['heads']}, "
              f"and heads by kv_heads {params['kv_heads']}", file=sys.stderr)
        return 2
    if args.out is not None:
        if args.out.exists():
            print(f"build_tiny_llama: {args.out} exists; give a new directory", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True)
        summary, path, built = build(params, args.out), args.out, True
    else:
        path, built = ensure(args.cache_root, params)
        summary = json.loads((path / "metralectl-build.json").read_text())
    if args.json:
        print(json.dumps({"model_dir": str(path), "built": built, **summary}, sort_keys=True))
    else:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
