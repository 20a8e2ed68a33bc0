#!/usr/bin/env bash
# Package a built llama-server (a cache entry of build-llama-server.sh: ENTRY/bin/llama-server) as a Docker image
# made from scratch: `docker import` of a root filesystem, so no base image and no registry is needed. It holds:
#   /usr/local/bin/llama-server           the binary (the ENTRYPOINT)
#   /usr/local/lib/llama-server/*.so*     every library ldd lists, plus libgcc_s.so.1, which glibc
#                                         dlopens at run time (thread cancellation, unwinding) and ldd
#                                         does not list; found through LD_LIBRARY_PATH
#   the dynamic loader at the path the binary names (PT_INTERP)
#   /tmp (1777), /etc/passwd, /etc/group, /etc/hosts, /etc/llama-server-build-info (BUILD-INFO)
# No shell, no CA bundle (llama-server is built without TLS; it reads weights from the mounted HF cache).
# The libraries are this machine's, so the image runs wherever this machine's binaries run (its CPU
# architecture, any Linux kernel Docker runs on).
#
# Usage: pack-llama-server.sh [--force] [--quiet] ENTRY IMAGE KEY-LABEL [--change INSTRUCTION]...
#   KEY-LABEL   the label that records a digest of every input (binary, loader, libraries, platform, layout and
#               the --change instructions): when IMAGE already carries the same digest nothing is done
#   --change    more Dockerfile instructions for `docker import` (LABEL, ENV, EXPOSE, ...)
#   --force     import even when IMAGE is up to date
# Prints IMAGE on stdout; progress on stderr. Used by images/build-llama-cpp-cpu.sh (the demo's image) and
# tests/real_llamacpp/image.sh (the tests' image).
set -euo pipefail

IMAGE_FORMAT=1  # bump when the image layout changes
FORCE=0
QUIET=0
ARGS=()
CHANGES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --quiet|-q) QUIET=1 ;;
    --change) [ $# -ge 2 ] || { echo "pack-llama-server.sh: --change needs an instruction" >&2; exit 2; }
      CHANGES+=("$2"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "pack-llama-server.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
[ "${#ARGS[@]}" = 3 ] || { echo "pack-llama-server.sh: needs ENTRY IMAGE KEY-LABEL (see --help)" >&2; exit 2; }
ENTRY=${ARGS[0]}
IMAGE=${ARGS[1]}
KEY_LABEL=${ARGS[2]}

say() { [ "$QUIET" = 1 ] || echo "pack-llama-server.sh: $*" >&2; }
die() { echo "pack-llama-server.sh: error: $*" >&2; exit 1; }

BIN="$ENTRY/bin/llama-server"
[ -x "$BIN" ] || die "$ENTRY holds no bin/llama-server (build it with build-llama-server.sh)"
command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (docker info failed)"

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
          for change in "${CHANGES[@]}"; do echo "change=$change"; done
        } | sha256sum | cut -d' ' -f1)"

# Serialise concurrent packaging of the same tag (parallel test sessions on one daemon).
if command -v flock >/dev/null; then
  exec 9>"${TMPDIR:-/tmp}/metralectl-pack-$(printf '%s' "$IMAGE" | tr -c 'A-Za-z0-9._-' '_').lock"
  flock -w 300 9 || die "timed out waiting for another packaging of $IMAGE"
fi
if [ "$FORCE" != 1 ]; then
  current="$(docker image inspect "$IMAGE" --format "{{ index .Config.Labels \"$KEY_LABEL\" }}" 2>/dev/null || true)"
  if [ "$current" = "$KEY" ]; then
    say "$IMAGE is up to date (llama-server sha256 ${BIN_SHA:0:12})"
    echo "$IMAGE"
    exit 0
  fi
fi
OLD_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM HUP
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
say "importing $IMAGE ($PLATFORM, from scratch: llama-server sha256 ${BIN_SHA:0:12} and ${#LIBS[@]} libraries)"
IMPORT=(--change 'ENTRYPOINT ["/usr/local/bin/llama-server"]' --change 'CMD ["--help"]'
        --change "ENV LD_LIBRARY_PATH=$LIBDIR" --change 'ENV PATH=/usr/local/bin' --change 'ENV HOME=/tmp'
        --change 'WORKDIR /tmp' --change "LABEL $KEY_LABEL=$KEY")
for change in "${CHANGES[@]}"; do IMPORT+=(--change "$change"); done
docker import --platform "$PLATFORM" "${IMPORT[@]}" --message "llama.cpp llama-server, packaged by pack-llama-server.sh" \
  "$WORK/rootfs.tar" "$IMAGE" >/dev/null

NEW_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}')"
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
  docker image rm "$OLD_ID" >/dev/null 2>&1 || true  # only succeeds when no container uses it
fi
say "built $IMAGE ($(docker image inspect "$IMAGE" --format '{{.Size}}') bytes)"
echo "$IMAGE"
