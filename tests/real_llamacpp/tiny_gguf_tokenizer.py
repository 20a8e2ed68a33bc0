"""Write the tokenizer of build_tiny_gguf.py's GGUFs as a Hugging Face tokenizer folder (tokenizer.json +
tokenizer_config.json), so a client that sizes prompts with a local tokenizer (AIPerf, llama-benchy) counts the
tokens llama-server counts.

TEST FIXTURE, standalone (stdlib + what build_tiny_gguf imports; no `tokenizers` needed to write it):

    python3 tests/real_llamacpp/tiny_gguf_tokenizer.py OUT_DIR

The same vocabulary in the same order (the 256 byte symbols, the learned merges, the ChatML control tokens), the
same merges, GPT-2's byte-level pre-tokenizer (llama.cpp's "gpt-2" pre-tokenizer) and the ChatML chat template;
every preset of build_tiny_gguf shares this tokenizer. On the ASCII prose the benchmarks send, both split alike
(tests/integration/test_aiperf_rate_real.py compares the counts with the server's /tokenize).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_tiny_gguf as B  # noqa: E402  (a sibling script, not a package)


def tokenizer_json() -> dict[str, Any]:
    sym = B.byte_symbols()
    learned, merges = B.train_bpe(B.CORPUS.read_text(encoding="utf-8"), B.MERGES)
    tokens = sym + learned + B.SPECIAL
    vocab = {t: i for i, t in enumerate(tokens)}
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in B.SPECIAL]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def write(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 1_000_000,
        "chat_template": B.CHAT_TEMPLATE}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_gguf_tokenizer.py OUT_DIR")
    print(write(Path(sys.argv[1])))
