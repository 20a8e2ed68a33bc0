"""Write the tiny random Llama that vLLM serves (tests/realengines/build_tiny_llama.py: safetensors, F32) as a GGUF
llama.cpp serves: the same weights, tensor for tensor, so `bench versus` compares two engines on one model.

TEST FIXTURE. Standalone (stdlib + numpy + the `gguf` package and build_tiny_gguf.py beside it; no metralectl, no
torch: the safetensors file is read by hand, its format is a JSON header and raw little-endian arrays):

    python3 tests/real_llamacpp/gguf_from_tiny_llama.py MODEL_DIR OUT.gguf

What a conversion has to do, as llama.cpp's own convert_hf_to_gguf.py does it for a Llama: the tensors renamed,
the query and key projections permuted from Hugging Face's rotary layout (halves) to GGUF's (interleaved pairs),
F32 kept as it is. The tokenizer is a Metaspace BPE ("▁" for a space, words split on whitespace); GGUF has no such
type, so it is written as llama.cpp's SentencePiece tokenizer ("llama") over the same vocabulary, each merged
token scored by its merge's rank (SentencePiece merges the best-scored pair whose join is a token, BPE the
earliest merge): on the ASCII prose the benchmarks send the two give the same tokens (the test compares prompt
token counts); a filler token no merge makes scores lowest.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tiny_gguf import add_llama_arch  # noqa: E402  (the architecture keys every tests' GGUF writes)

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {spec['dtype']}, this fixture converts F32 only")
        start, end = spec["data_offsets"]
        out[name] = np.frombuffer(data[8 + size + start:8 + size + end], dtype="<f4").reshape(spec["shape"]).copy()
    return out


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotary halves -> interleaved pairs, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)  # model.layers.N.<part>.weight
    return f"blk.{layer}.{NAMES[rest.removesuffix('.weight')]}.weight"


def convert(model_dir: Path, out: Path) -> dict[str, Any]:
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in tok["model"]["merges"]]
    rank = {a + b: i for i, (a, b) in enumerate(merges)}
    special = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "the vocabulary's ids are not 0..n-1"
    scores, types = [], []
    for t in tokens:
        if t in special:
            scores.append(0.0)
            types.append(gguf.TokenType.UNKNOWN if t == "<unk>" else gguf.TokenType.CONTROL)
        else:
            scores.append(-float(rank[t]) if t in rank else (0.0 if len(t) == 1 else -1e9))
            types.append(gguf.TokenType.NORMAL)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = (config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0
    writer = gguf.GGUFWriter(str(out), "llama")
    add_llama_arch(writer, name="tiny-llama-vllm", context=config["max_position_embeddings"],
                   hidden=config["hidden_size"], layers=config["num_hidden_layers"], ffn=config["intermediate_size"],
                   heads=heads, kv_heads=kv_heads, vocab_size=len(tokens), file_type=gguf.LlamaFileType.ALL_F32,
                   head_dim=head_dim, rope_base=float(rope), rms_eps=float(config["rms_norm_eps"]))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_unk_token_id(vocab["<unk>"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)  # the chat template writes the BOS itself
    writer.add_add_space_prefix(False)  # Metaspace "first": a chat prompt starts with a special token, never "▁"
    writer.add_chat_template(tok_config["chat_template"])
    for hf, w in sorted(read_safetensors(model_dir / "model.safetensors").items()):
        if hf.endswith("self_attn.q_proj.weight"):
            w = permute(w, heads)
        elif hf.endswith("self_attn.k_proj.weight"):
            w = permute(w, kv_heads)
        writer.add_tensor(tensor_name(hf), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"tokens": len(tokens), "merges": len(merges), "layers": config["num_hidden_layers"]}


if __name__ == "__main__":
    print(json.dumps(convert(Path(sys.argv[1]), Path(sys.argv[2]))))
