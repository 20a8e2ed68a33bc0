#!/usr/bin/env bash
# Build the TEST image metralectl-test/engine-double:latest from nothing pulled (no registry needed).
#
# The image is a `docker import` of a tiny root filesystem: a static busybox (from Debian's
# busybox-static package), the engine test double (tests/engine_double/metrale_double.py) and a
# wrapper at /usr/local/bin/met that execs a Python interpreter on the double. The entrypoint is
# `met`, so `docker run IMAGE serve MODEL --port N ...` and `docker run IMAGE --version` work like
# the real engine image. The image ships NO Python: containers must bind-mount the host
# interpreter read-only (see mounts.py: sys.base_prefix, /lib, /lib64, /usr/lib, and
# DOUBLE_PYTHON=<interpreter>).
#
# Labels: org.opencontainers.image.revision=test-double-<sha256 of metrale_double.py>
#         metralectl.test.build-key=<digest of every build input>  (the up-to-date check)
# Platform: the Docker server's own (docker version --format '{{.Server.Os}}/{{.Server.Arch}}').
#
# Usage: build.sh [--force] [--python PATH] [--image NAME:TAG] [--quiet]
#   --image   the tag to build (default: $METRALECTL_TEST_ENGINE_IMAGE, else metralectl-test/engine-double:latest;
#             a worktree whose double differs from another's on the same daemon builds under its own tag)
#   --python  interpreter recorded in the wrapper as its default (default: the base interpreter
#             of `python3` on PATH, i.e. what mounts.py's interpreter_path() reports)
# Idempotent: when the image exists with the same build key it does nothing (well under a second).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DOUBLE="$(cd "$HERE/../engine_double" && pwd)/metrale_double.py"
IMAGE="${METRALECTL_TEST_ENGINE_IMAGE:-metralectl-test/engine-double:latest}"
PYTHON_PATH=""
FORCE=0
QUIET=0
BUILD_FORMAT=1  # bump when the image layout changes

while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --quiet|-q) QUIET=1 ;;
    --python) PYTHON_PATH="$2"; shift ;;
    --image) IMAGE="$2"; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

say() { [ "$QUIET" = 1 ] || echo "build.sh: $*"; }
die() { echo "build.sh: $*" >&2; exit 1; }

[ -f "$DOUBLE" ] || die "missing $DOUBLE"
command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (run tests/docker_image/start-dockerd.sh)"

if [ -z "$PYTHON_PATH" ]; then
  PYTHON_PATH="$(python3 "$HERE/mounts.py" --interpreter-path)"
fi

# Serialise concurrent builds (e.g. parallel test workers).
LOCK="${TMPDIR:-/tmp}/metralectl-engine-double-build-$(printf '%s' "$IMAGE" | sha256sum | cut -c1-12).lock"
if command -v flock >/dev/null; then
  exec 9>"$LOCK"
  flock -w 120 9 || die "timed out waiting for $LOCK"
fi

# ---- a static busybox, without installing anything system-wide if we can avoid it
find_busybox() {
  for b in "${BUSYBOX:-}" /bin/busybox /usr/bin/busybox; do
    [ -n "$b" ] && [ -x "$b" ] || continue
    # static = an ELF without a PT_INTERP program header (no readelf/file needed)
    if python3 - "$b" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read(1 << 16)
if d[:4] != b"\x7fELF": sys.exit(1)
is64, end = d[4] == 2, "<" if d[5] == 1 else ">"
phoff, phentsize, phnum = ((struct.unpack_from(end + "Q", d, 32)[0], *struct.unpack_from(end + "HH", d, 54))
                           if is64 else (struct.unpack_from(end + "I", d, 28)[0], *struct.unpack_from(end + "HH", d, 42)))
types = [struct.unpack_from(end + "I", d, phoff + i * phentsize)[0] for i in range(phnum)]
sys.exit(1 if 3 in types else 0)  # PT_INTERP == 3
PY
    then echo "$b"; return 0; fi
  done
  return 1
}
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/metralectl-test"
BUSYBOX_BIN="$(find_busybox || true)"
if [ -z "$BUSYBOX_BIN" ] && [ -x "$CACHE/busybox-static/bin/busybox" ]; then
  BUSYBOX_BIN="$CACHE/busybox-static/bin/busybox"
fi
if [ -z "$BUSYBOX_BIN" ]; then
  say "fetching busybox-static from Debian's packages"
  mkdir -p "$CACHE/debs"
  ( cd "$CACHE/debs" && { apt-get download busybox-static >/dev/null 2>&1 || {
      [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null && apt-get download busybox-static >/dev/null; }; } ) \
    || die "cannot get busybox-static (apt-get download busybox-static failed)"
  rm -rf "$CACHE/busybox-static"
  dpkg-deb -x "$(ls -t "$CACHE"/debs/busybox-static_*.deb | head -n1)" "$CACHE/busybox-static"
  BUSYBOX_BIN="$CACHE/busybox-static/bin/busybox"
  [ -x "$BUSYBOX_BIN" ] || die "busybox-static package has no bin/busybox"
fi

PLATFORM="$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')"
DOUBLE_SHA="$(sha256sum "$DOUBLE" | cut -d' ' -f1)"
REVISION="test-double-$DOUBLE_SHA"

WRAPPER="$(cat <<EOF
#!/bin/sh
# met - TEST IMAGE wrapper: runs the Metrale engine TEST DOUBLE, not the engine.
# The interpreter is bind-mounted from the host (see tests/docker_image/mounts.py).
DOUBLE=/usr/local/lib/metrale-double/metrale_double.py
for py in "\${DOUBLE_PYTHON:-}" "$PYTHON_PATH" /usr/local/bin/python3 /usr/bin/python3; do
  if [ -n "\$py" ] && [ -x "\$py" ]; then
    exec "\$py" -s -u -B "\$DOUBLE" "\$@"
  fi
done
echo "met (test double): no Python interpreter in the container; bind-mount the host's" \\
     "(sys.base_prefix, /lib, /lib64, /usr/lib read-only) and set DOUBLE_PYTHON" >&2
exit 127
EOF
)"

KEY="$( { echo "format=$BUILD_FORMAT"; echo "platform=$PLATFORM"; echo "double=$DOUBLE_SHA";
          echo "wrapper=$(printf '%s' "$WRAPPER" | sha256sum | cut -d' ' -f1)";
          echo "busybox=$(sha256sum "$BUSYBOX_BIN" | cut -d' ' -f1)"; } | sha256sum | cut -d' ' -f1)"

if [ "$FORCE" != 1 ]; then
  current="$(docker image inspect "$IMAGE" \
    --format '{{ index .Config.Labels "metralectl.test.build-key" }}' 2>/dev/null || true)"
  if [ "$current" = "$KEY" ]; then
    say "$IMAGE is up to date ($REVISION)"
    exit 0
  fi
fi
OLD_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"
mkdir -p "$ROOT"/{bin,etc,tmp,root,proc,sys,dev,usr/local/bin,usr/local/lib/metrale-double}
chmod 1777 "$ROOT/tmp"
cp "$BUSYBOX_BIN" "$ROOT/bin/busybox"
chmod 0755 "$ROOT/bin/busybox"
for applet in sh ash cat echo env ls ps kill sleep true false test mkdir rm cp mv grep sed \
              head tail wc id uname hostname printf readlink nc wget; do
  ln -s busybox "$ROOT/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$ROOT/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ROOT/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$ROOT/etc/hosts"
cp "$DOUBLE" "$ROOT/usr/local/lib/metrale-double/metrale_double.py"
printf '%s\n' "$WRAPPER" > "$ROOT/usr/local/bin/met"
chmod 0755 "$ROOT/usr/local/bin/met" "$ROOT/usr/local/lib/metrale-double/metrale_double.py"
printf 'TEST IMAGE: the Metrale engine test double (metralectl tests). Not the engine.\n%s\n' \
  "$REVISION" > "$ROOT/etc/metrale-double-release"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$ROOT" -cf "$WORK/rootfs.tar" .

say "importing $IMAGE ($PLATFORM, $REVISION)"
docker import --platform "$PLATFORM" \
  --change 'ENTRYPOINT ["/usr/local/bin/met"]' \
  --change 'CMD ["--version"]' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
  --change 'WORKDIR /' \
  --change "LABEL org.opencontainers.image.revision=$REVISION" \
  --change "LABEL org.opencontainers.image.title=metrale-engine-test-double" \
  --change "LABEL org.opencontainers.image.description=TEST_FIXTURE_not_the_Metrale_engine" \
  --change "LABEL metralectl.test.build-key=$KEY" \
  --message "metralectl engine test double ($REVISION)" \
  "$WORK/rootfs.tar" "$IMAGE" >/dev/null

NEW_ID="$(docker image inspect "$IMAGE" --format '{{.Id}}')"
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
  docker image rm "$OLD_ID" >/dev/null 2>&1 || true  # only succeeds when nothing uses it
fi
say "built $IMAGE $NEW_ID"
