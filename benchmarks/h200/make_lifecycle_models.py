"""Write the lifecycle run's three GGUF checkpoints into a Hugging Face cache, offline: two random-weight
F16 Llamas of different sizes (A, B) and a damaged one (a truncated copy of A), each verified in the cache
exactly as `metralectl pull` leaves a download (the snapshot's manifest), so `run`/`swap` take them as staged.

    python3 benchmarks/h200/make_lifecycle_models.py --hf-cache DIR [--preset gpu|tiny] [--json]

Presets: `gpu` (the H200 run) A = hidden 2048 x 22 layers (~0.97B parameters, ~1.9 GB F16), B = hidden 2560
x 22 layers (~1.5B, ~3.0 GB F16) — real work for the GPU to load and serve; `tiny` (a CPU dry run) the same
architecture at hidden 64/128, 2 layers (a few hundred KB). The damaged checkpoint is A's file cut to
`--damaged-fraction` (default 0.5) of its bytes: its header reads, its tensor data runs past the end of the
file, so llama-server fails while loading it.

The tokenizer, the chat template and the output rows (only printable-ASCII tokens can win, so decoding never
ends early and never stops inside a UTF-8 character) are tests/real_llamacpp/build_tiny_gguf.py's. Weights
are slices of one random pool, not independent draws: the numbers do not matter to serving speed, and
generating 2.5B normal samples would cost ~30 s of the device's time. Deterministic: the same preset gives
the same bytes, and a checkpoint already in the cache is kept (its manifest is checked, not rewritten).

Needs numpy, the `gguf` package and metralectl (for the manifest); prints a JSON summary with --json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TREE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TREE / "tests" / "real_llamacpp"))
import build_tiny_gguf as tiny  # noqa: E402  (the tokenizer and chat template of the tests' GGUF)

ORG = "metralectl-test"
QUANT = "F16"
POOL = 1 << 24  # 16M random values per scale, sliced into every tensor


@dataclass(frozen=True)
class Shape:
    name: str  # the repo's NAME and the file's stem
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int = 4096

    @property
    def repo(self) -> str:
        return f"{ORG}/{self.name}"

    @property
    def filename(self) -> str:
        return f"{self.name}-{QUANT}.gguf"


PRESETS: dict[str, tuple[Shape, Shape]] = {
    "gpu": (Shape("lifecycle-a-f16", 2048, 22, 32, 4, 5632), Shape("lifecycle-b-f16", 2560, 22, 20, 4, 6912)),
    "tiny": (Shape("lifecycle-a-f16", 64, 2, 4, 4, 128), Shape("lifecycle-b-f16", 128, 2, 4, 4, 256)),
}
DAMAGED = "lifecycle-damaged-f16"


class Pool:
    """Random F16 values for any tensor: one pool per scale, read cyclically from a random offset."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        base = self.rng.standard_normal(POOL, dtype=np.float32)
        self.pools = {std: (base * std).astype(np.float16) for std in (0.02, 1.0)}

    def take(self, rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        pool, n = self.pools[std], rows * cols
        start = int(self.rng.integers(len(pool)))
        reps = -(-(start + n) // len(pool))
        flat = np.tile(pool, reps)[start:start + n] if reps > 1 else pool[start:start + n]
        return np.ascontiguousarray(flat).reshape(rows, cols)


def write_gguf(path: Path, shape: Shape, seed: int) -> dict[str, Any]:
    import gguf

    vocab = tiny.bpe_vocab()
    pool = Pool(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    tiny.add_llama_arch(writer, name=shape.name, context=shape.context, hidden=shape.hidden, layers=shape.layers,
                        ffn=shape.ffn, heads=shape.heads, kv_heads=shape.kv_heads, vocab_size=len(vocab.tokens),
                        file_type=gguf.LlamaFileType.MOSTLY_F16)
    tiny.add_bpe_tokenizer(writer, vocab)
    tiny.add_random_llama_tensors(writer, shape, vocab, pool.take, writer.add_tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"vocab": len(vocab.tokens), "params": tiny.llama_params(shape, len(vocab.tokens)), "hidden": shape.hidden,
            "layers": shape.layers}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def place(hub: Path, repo: str, filename: str, built: Path) -> dict[str, Any]:
    """Move `built` into the cache as huggingface_hub lays a download out, and record it verified."""
    from metralectl.seams.hf import cache as hfcache, listing as hflisting

    base = hub / ("models--" + repo.replace("/", "--"))
    sha = sha256(built)
    revision = hashlib.sha1(f"{repo}@{sha}".encode()).hexdigest()  # a commit-like 40-hex id
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    blob = base / "blobs" / sha
    size = built.stat().st_size
    os.replace(built, blob)
    snap = base / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    link = snap / filename
    if not link.is_symlink():
        link.symlink_to(Path("..") / ".." / "blobs" / sha)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(revision)
    files = (hflisting.RepoFile(filename, size, sha),)
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, revision, files).to_json())
    return {"repo": repo, "quant": QUANT, "file": str(link), "revision": revision, "sha256": sha, "bytes": size}


def existing(hub: Path, repo: str) -> dict[str, Any] | None:
    """The checkpoint already in the cache with its manifest (a warm machine's second call), else None."""
    from metralectl.seams.hf import cache as hfcache

    base = hub / ("models--" + repo.replace("/", "--"))
    try:
        revision = (base / "refs" / "main").read_text().strip()
        manifest = json.loads((base / "snapshots" / revision / hfcache.VERIFIED_MANIFEST).read_text())
        [entry] = manifest["files"]
        link = base / "snapshots" / revision / entry["path"]
        if link.stat().st_size != entry["size"]:
            return None
    except (OSError, ValueError, KeyError):
        return None
    return {"repo": repo, "quant": QUANT, "file": str(link), "revision": revision, "sha256": entry["sha256"],
            "bytes": entry["size"], "reused": True}


def make(hub: Path, preset: str, damaged_fraction: float) -> dict[str, Any]:
    out: dict[str, Any] = {"preset": preset, "hf_cache": str(hub)}
    for key, shape, seed in (("a", PRESETS[preset][0], 1), ("b", PRESETS[preset][1], 2)):
        found = existing(hub, shape.repo)
        if found is not None:
            out[key] = found
            continue
        began = time.monotonic()
        with tempfile.TemporaryDirectory(dir=hub) as tmp:
            built = Path(tmp) / shape.filename
            stats = write_gguf(built, shape, seed)
            out[key] = {**place(hub, shape.repo, shape.filename, built), **stats,
                        "write_s": round(time.monotonic() - began, 2)}
    damaged_repo = f"{ORG}/{DAMAGED}"
    found = existing(hub, damaged_repo)
    if found is None:
        source = Path(out["a"]["file"]).resolve()
        keep = int(source.stat().st_size * damaged_fraction)
        with tempfile.TemporaryDirectory(dir=hub) as tmp:
            cut = Path(tmp) / f"{DAMAGED}-{QUANT}.gguf"
            with source.open("rb") as src, cut.open("wb") as dst:
                left = keep
                while left > 0 and (chunk := src.read(min(left, 1 << 24))):
                    dst.write(chunk)
                    left -= len(chunk)
            found = {**place(hub, damaged_repo, cut.name, cut), "truncated_from": out["a"]["bytes"]}
    out["damaged"] = found
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-cache", required=True, type=Path, help="the HF hub cache directory (HF_HUB_CACHE)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    parser.add_argument("--damaged-fraction", type=float, default=0.5,
                        help="the share of A's bytes the damaged checkpoint keeps (0 < f < 1)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    args = parser.parse_args(argv)
    if not 0 < args.damaged_fraction < 1:
        parser.error("--damaged-fraction must be between 0 and 1")
    args.hf_cache.mkdir(parents=True, exist_ok=True)
    summary = make(args.hf_cache, args.preset, args.damaged_fraction)
    print(json.dumps(summary, indent=2) if args.json else "\n".join(summary[k]["repo"] for k in ("a", "b", "damaged")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
