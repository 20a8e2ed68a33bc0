#!/bin/sh
# metralectl installer for Linux and macOS.
#
# No release of metralectl (the distribution metralectl-cockpit) is published yet, so there is no
# address to download one from: give the installer a release directory, e.g. one built from a
# checkout (docs/install.md):
#
#   python3 scripts/release.py build --out dist/release/local
#   METRALECTL_DOWNLOAD_URL="$PWD/dist/release/local" sh install/install.sh
#   sh install/install.sh --uninstall
#
# Without METRALECTL_DOWNLOAD_URL it stops, says so, and installs nothing. (The installer served on
# the Metrale engine team's site installs THEIR launcher, also named `metralectl`, not this one.)
#
# What it does (docs/install.md says why, in full):
#   1. downloads SHA256SUMS, the wheel and this platform's dependency lock from the release
#      directory, and REFUSES to go on unless each file's SHA-256 is listed in SHA256SUMS;
#   2. builds a new, private virtual environment under ${XDG_DATA_HOME:-~/.local/share}/metralectl,
#      installs the locked dependencies with `pip --require-hashes`, then the wheel;
#   3. switches to it atomically (symlinks renamed into place), so a running metralectl keeps
#      working and nothing is ever written over a file in use;
#   4. links `metralectl` into ~/.local/bin, and says (or writes once) the PATH line if needed;
#   5. installs shell completion for the login shell (bash, zsh or fish), and the man page
#      (`man metralectl`) into ${XDG_DATA_HOME:-~/.local/share}/man/man1;
#   6. installs the background agent as a systemd user unit.
#
# Options:  --uninstall  --allow-root  --no-start  --no-modify-path  --no-completion  --help
# Environment:
#   METRALECTL_DOWNLOAD_URL   the release directory to install from (required until a release is
#                             published): a directory, file://, https://, or http:// to this machine
#   METRALECTL_INSTALL_DIR    where the `metralectl` command goes (default ~/.local/bin)
#   METRALECTL_PYTHON         the Python to build the environment from
#   METRALECTL_NO_MODIFY_PATH=1   never edit a shell profile; print the line instead
#   METRALECTL_NO_COMPLETION=1    do not install shell completion
#   METRALECTL_NO_AGENT=1     do not install the background agent's unit
#   METRALECTL_NO_START=1     install the agent's unit but do not enable or start it
#   pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, pip.conf) choose where the dependencies
#   come from; their hashes are checked whatever the source.
#
# Every line below is inside a function. The only command at the top level is the very last line,
# inside braces, which sh cannot start before it has read the closing brace: a download cut short
# anywhere runs nothing.

# --- messages ---------------------------------------------------------------------------------

say() { printf '%s\n' "$*"; }
warn() { printf 'metralectl installer: warning: %s\n' "$*" >&2; }
# Nothing is committed until install_commit; before that `die` means "nothing was installed".
die() {
    printf 'metralectl installer: error: %s\n' "$*" >&2
    if [ "${COMMITTED:-0}" = 1 ]; then
        printf 'metralectl installer: the new version is installed; only the step above failed.\n' >&2
    else
        printf 'metralectl installer: nothing was installed or changed.\n' >&2
    fi
    exit 1
}

usage() {
    say "usage: install.sh [--uninstall] [--allow-root] [--no-start] [--no-modify-path] [--no-completion]"
    say "  METRALECTL_DOWNLOAD_URL=RELEASE-DIRECTORY sh install.sh [options]"
    say "See the comment at the top of this script, or docs/install.md, for the environment variables."
}

# --- arguments and refusals -------------------------------------------------------------------

parse_args() {
    MODE=install
    ALLOW_ROOT=0
    NO_START=${METRALECTL_NO_START:-0}
    NO_MODIFY_PATH=${METRALECTL_NO_MODIFY_PATH:-0}
    NO_AGENT=${METRALECTL_NO_AGENT:-0}
    NO_COMPLETION=${METRALECTL_NO_COMPLETION:-0}
    for arg in "$@"; do
        case "$arg" in
            --uninstall) MODE=uninstall ;;
            --allow-root) ALLOW_ROOT=1 ;;
            --no-start) NO_START=1 ;;
            --no-modify-path) NO_MODIFY_PATH=1 ;;
            --no-completion) NO_COMPLETION=1 ;;
            -h | --help) usage; exit 0 ;;
            *) usage >&2; die "unknown option: $arg" ;;
        esac
    done
}

# Root: the models would run as root, the Hugging Face cache would become root's (or files in the
# user's cache root-owned, so the next normal run fails oddly), and sudo's PATH usually lacks
# ~/.local/bin anyway. The install belongs to the user who runs metralectl (SPEC §5).
refuse_root() {
    [ "$(id -u)" = 0 ] || return 0
    if [ "$ALLOW_ROOT" = 1 ]; then
        warn "running as root (--allow-root): installing into root's home (${HOME:-?})"
        return 0
    fi
    if [ -n "${SUDO_USER:-}" ]; then
        printf 'metralectl installer: you ran this with sudo; run it as %s instead, without sudo.\n' "$SUDO_USER" >&2
    fi
    die "refusing to install as root: metralectl belongs to the user who runs the models (as root,
  models run as root, the Hugging Face cache becomes root-owned and later runs as your user fail,
  and sudo's PATH does not include ~/.local/bin). Run it as your normal user; that user only needs
  to be in the 'docker' group. To install for root anyway: sh -s -- --allow-root"
}

need_cmd() {
    command -v "$1" >/dev/null 2>&1 || die "this installer needs '$1', which is not on PATH"
}

# The user-chosen directories: `~` must not become a folder named '~' (a quoted "~/bin" in an env
# file arrives here unexpanded), and a relative path would depend on where the script ran.
expand_dir() {
    case "$1" in
        \~) printf '%s\n' "$HOME" ;;
        \~/*) printf '%s\n' "$HOME/${1#\~/}" ;;
        \~*) die "cannot expand '$1' (only ~ and ~/... are understood): give an absolute path" ;;
        /*) printf '%s\n' "$1" ;;
        *) die "'$1' is not an absolute path: give an absolute path (or one starting with ~/)" ;;
    esac
}

set_paths() {
    [ -n "${HOME:-}" ] || die "HOME is not set"
    case "$HOME" in /*) ;; *) die "HOME ($HOME) is not an absolute path" ;; esac
    BIN_DIR=$(expand_dir "${METRALECTL_INSTALL_DIR:-$HOME/.local/bin}") || exit 1
    BIN_DIR=${BIN_DIR%/}
    [ -n "$BIN_DIR" ] || BIN_DIR=/
    BIN_LINK="$BIN_DIR/metralectl"
    case "${XDG_DATA_HOME:-}" in
        /*) DATA_DIR="${XDG_DATA_HOME%/}/metralectl" ;;
        *) DATA_DIR="$HOME/.local/share/metralectl" ;;   # unset, or relative: ignored per XDG
    esac
    case "${XDG_CONFIG_HOME:-}" in
        /*) CONFIG_HOME="${XDG_CONFIG_HOME%/}" ;;
        *) CONFIG_HOME="$HOME/.config" ;;
    esac
    DATA_HOME=${DATA_DIR%/metralectl}
    RECEIPT="$DATA_DIR/receipt"
    # Marks the PATH lines this installer writes, so --uninstall removes exactly those.
    PATH_MARKER='# added by the metralectl installer (install.sh --uninstall removes it)'
    UNIT_NAME=metralectl-agent.service
    UNIT_FILE="$CONFIG_HOME/systemd/user/$UNIT_NAME"
}

# --- downloading and verifying ----------------------------------------------------------------

set_base_url() {
    [ -n "${METRALECTL_DOWNLOAD_URL:-}" ] || refuse_no_release
    BASE_URL=${METRALECTL_DOWNLOAD_URL%/}
    # A directory given as a path (a release built from a checkout) is read as file://.
    case "$BASE_URL" in
        /*) BASE_URL="file://$BASE_URL" ;;
    esac
    check_download_url "$BASE_URL"
}

# No release is published yet, so there is no default address: this project has no release location
# of its own, and the one address an older installer used belongs to the engine team's launcher (also
# named `metralectl`): it would install their tool, not this one.
refuse_no_release() {
    die "no release of metralectl (metralectl-cockpit) is published yet, so there is nothing to download.
  Install it from a checkout of its repository instead (docs/install.md), in the checkout's top directory:
    uv tool install .
    pipx install .
  or build a release there and install it with this script:
    python3 scripts/release.py build --out dist/release/local && METRALECTL_DOWNLOAD_URL=\"\$PWD/dist/release/local\" sh install/install.sh
  (METRALECTL_DOWNLOAD_URL names the release directory: a path, file://, https://, or http:// to this machine)"
}

# printable URL: a URL as it can be shown (every byte outside printable ASCII becomes '?').
printable() {
    printf '%s' "$1" | LC_ALL=C tr -c '\041-\176' '?'
}

# check_download_url URL: dies unless URL is https://, file://, or http:// to this machine.
# Plain http lets anyone on the path replace the files and SHA256SUMS together, so it is accepted
# only to a loopback host (tests, a local mirror). The URL is parsed, not matched by prefix: a
# prefix test takes http://127.0.0.1:x@other/ for loopback, and curl and wget go to 'other'.
check_download_url() {
    cu_show=$(printable "$1")
    # Only the characters RFC 3986 allows in a URL: no spaces, control bytes or backslashes, which
    # URL parsers disagree on (some read '\' as '/').
    # (What is left once they are deleted, and a '"' added so that a final newline stays in "$(...)".)
    cu_bad=$(printf '%s"' "$1" | LC_ALL=C tr -d "A-Za-z0-9._~:/!\$&'()*+,;=%@\133\135-")
    [ "$cu_bad" = '"' ] ||
        die "refusing to download from '$cu_show': it has characters a release directory's URL does not need (a space, a control character, '\\', '?', '#', a quote, '<', '>', ...); only https:// (or http:// to this machine)"
    case "$1" in
        file://*) return 0 ;;
        https://*) cu_scheme=https ;;
        http://*) cu_scheme=http ;;
        *) die "refusing to download from '$cu_show': only https:// (or http:// to this machine, or file://)" ;;
    esac
    cu_rest=${1#*://}
    cu_authority=${cu_rest%%/*}
    case "$cu_authority" in
        *@*) die "refusing to download from '$cu_show': it has user info ('...@') before the host.
  Everything before '@' is a user name and password, not the host: http://127.0.0.1:x@other/ downloads
  from 'other'. Give the host alone (only https://, or http:// to this machine)" ;;
        '') die "refusing to download from '$cu_show': it names no host" ;;
    esac
    # host[:port], the host possibly in brackets (IPv6)
    case "$cu_authority" in
        \[*\]) cu_host=$cu_authority; cu_port="" ;;
        \[*\]:*) cu_host=${cu_authority%%]:*}]; cu_port=${cu_authority#*]:} ;;
        \[*) die "refusing to download from '$cu_show': the host has no closing ']'" ;;
        *:*) cu_host=${cu_authority%%:*}; cu_port=${cu_authority#*:} ;;
        *) cu_host=$cu_authority; cu_port="" ;;
    esac
    case "$cu_authority" in
        *:) die "refusing to download from '$cu_show': ':' without a port number" ;;
    esac
    [ -n "$cu_host" ] || die "refusing to download from '$cu_show': it names no host"
    case "$cu_port" in
        '') ;;
        *[!0-9]* | ??????*) die "refusing to download from '$cu_show': the port '$cu_port' is not a number from 1 to 65535" ;;
        *) if [ "$cu_port" -lt 1 ] || [ "$cu_port" -gt 65535 ]; then
               die "refusing to download from '$cu_show': the port '$cu_port' is not a number from 1 to 65535"
           fi ;;
    esac
    [ "$cu_scheme" = https ] && return 0
    is_loopback_host "$cu_host" && return 0
    die "refusing to download from '$cu_show': only https:// (or http:// to this machine).
  Plain http:// to '$(printable "$cu_host")' would let anyone on the network path replace the files and
  SHA256SUMS together. Plain http:// is accepted only to a loopback host: 127.0.0.0/8 written as four
  decimal numbers, [::1] or localhost. Use https:// (or file:// for a copied release directory)"
}

# is_loopback_host HOST: localhost, [::1], or 127.a.b.c in plain dotted decimal (no shorthand such as
# 127.1, no octal or hex: tools disagree on what those mean).
is_loopback_host() {
    case "$1" in
        localhost | '[::1]') return 0 ;;
        127.*) lh_rest=${1#127.} ;;
        *) return 1 ;;
    esac
    lh_count=0
    while :; do
        lh_octet=${lh_rest%%.*}
        case "$lh_octet" in
            0) ;;
            '' | *[!0-9]* | 0* | ????*) return 1 ;;
            *) [ "$lh_octet" -le 255 ] || return 1 ;;
        esac
        lh_count=$((lh_count + 1))
        [ "$lh_rest" = "$lh_octet" ] && break
        lh_rest=${lh_rest#*.}
    done
    [ "$lh_count" = 3 ]
}

# After set_base_url. curl: its first request only in the base URL's scheme, redirects only to https://.
pick_downloader() {
    if command -v curl >/dev/null 2>&1; then
        DOWNLOADER=curl
        CURL_PROTO="--proto =${BASE_URL%%://*} --proto-redir =https"
    elif command -v wget >/dev/null 2>&1; then
        DOWNLOADER=wget
    else
        die "neither curl nor wget is on PATH"
    fi
}

# download URL DEST: --fail so an HTTP error (a 404 page) is an error, not a file; curl retries what
# is worth retrying (timeouts, 5xx, refused connections) by itself, never a 404. A redirect is
# followed only to https:// (CURL_PROTO; wget_get for wget): a redirect to plain http would let
# anyone on the path answer in the release directory's name.
download() {
    rm -f "$2"
    if [ "$DOWNLOADER" = curl ]; then
        dl_rc=0
        # shellcheck disable=SC2086 # CURL_PROTO is words split on purpose
        curl --fail --silent --show-error --location $CURL_PROTO \
            --connect-timeout 20 --retry 3 --retry-delay 1 --retry-connrefused \
            --output "$2" "$1" || dl_rc=$?
        # 1: "protocol not supported or disabled": here, a redirect to something other than https://
        [ "$dl_rc" = 1 ] && warn "$(printable "$1") redirected to a URL that is not https://: not followed"
        [ "$dl_rc" = 0 ] || return 1
    else
        dl_try=1
        while :; do
            dl_rc=0
            wget_get "$1" "$2" || dl_rc=$?
            [ "$dl_rc" = 0 ] && break
            rm -f "$2"
            # 2: a redirect refused; trying again would get the same answer
            [ "$dl_rc" = 2 ] || [ "$dl_try" -ge 3 ] && return 1
            sleep "$dl_try"
            dl_try=$((dl_try + 1))
        done
    fi
    [ -f "$2" ]
}

# wget_get URL DEST: wget, following redirects one hop at a time and only to https://. wget has no
# --proto-redir, and its --https-only is for recursive downloads only: wget 1.21 follows an
# https -> http redirect even with it. Returns 1 on an error, 2 on a refused redirect.
wget_get() {
    wg_url=$1
    wg_hops=0
    while :; do
        rm -f "$2"
        if wget -nv --server-response --max-redirect=0 -O "$2" "$wg_url" 2>"$2.wget-log"; then
            rm -f "$2.wget-log"
            return 0
        fi
        wg_status=$(sed -n 's/^[[:space:]]*HTTP\/[0-9.]*[[:space:]]\{1,\}\([0-9][0-9][0-9]\).*/\1/p' "$2.wget-log" | tail -n 1)
        wg_loc=$(tr -d '\r' <"$2.wget-log" | sed -n 's/^[[:space:]]*[Ll][Oo][Cc][Aa][Tt][Ii][Oo][Nn]:[[:space:]]*//p' | tail -n 1)
        case "$wg_status" in
            301 | 302 | 303 | 307 | 308) [ -n "$wg_loc" ] ;;
            *) false ;;
        esac || {
            # not a redirect: wget's own lines (not the server's headers, which are indented)
            grep -v '^[[:space:]]' "$2.wget-log" | tail -n 3 | while IFS= read -r wg_line; do
                warn "wget: $(printable "$wg_line")"
            done
            rm -f "$2.wget-log"
            return 1
        }
        rm -f "$2.wget-log"
        wg_rest=${wg_url#*://}
        case "$wg_loc" in
            *://*) wg_next=$wg_loc ;;
            //*) wg_next="${wg_url%%://*}:$wg_loc" ;;
            /*) wg_next="${wg_url%%://*}://${wg_rest%%/*}$wg_loc" ;;
            *) case "$wg_rest" in
                   */*) wg_next="${wg_url%/*}/$wg_loc" ;;
                   *) wg_next="$wg_url/$wg_loc" ;;
               esac ;;
        esac
        case "$wg_next" in
            https://*) ;;
            *)
                warn "$(printable "$wg_url") redirected to $(printable "$wg_next"), which is not https://: not followed"
                return 2
                ;;
        esac
        wg_hops=$((wg_hops + 1))
        if [ "$wg_hops" -gt 10 ]; then
            warn "$(printable "$1"): more than 10 redirects: not followed"
            return 2
        fi
        wg_url=$wg_next
    done
}

# Fail closed: without a tool to check SHA-256 nothing is installed (installers that skip the check
# when sha256sum is absent make the check optional for exactly the machines an attacker picks).
pick_hasher() {
    if command -v sha256sum >/dev/null 2>&1; then
        HASHER=sha256sum
    elif command -v shasum >/dev/null 2>&1; then
        HASHER=shasum        # macOS (perl's shasum)
    elif command -v openssl >/dev/null 2>&1; then
        HASHER=openssl
    else
        die "no SHA-256 tool found (sha256sum, shasum or openssl): refusing to install files that cannot be verified"
    fi
}

file_sha256() {
    case "$HASHER" in
        sha256sum) fs_out=$(sha256sum "$1") ;;
        shasum) fs_out=$(shasum -a 256 "$1") ;;
        openssl) fs_out=$(openssl dgst -sha256 -r "$1") ;;
    esac || return 1
    # All three print the hex digest first; normalise case.
    printf '%s\n' "${fs_out%% *}" | tr 'A-F' 'a-f'
}

# sums_lookup NAME: the hash SHA256SUMS gives for NAME, lower-case; empty when there is no entry.
# Accepts "<hex>  name", "<hex> *name" (binary mode), "./name", CRLF line ends and upper-case hex;
# two different hashes for one name print nothing (ambiguous is as bad as missing).
sums_lookup() {
    tr -d '\r' <"$TMP_DIR/SHA256SUMS" | awk -v want="$1" '
        NF >= 2 && length($1) == 64 && $1 ~ /^[0-9A-Fa-f]+$/ {
            name = $2; sub(/^\*/, "", name); sub(/^\.\//, "", name)
            if (name == want) { h = tolower($1); if (found != "" && found != h) bad = 1; found = h }
        }
        END { if (!bad) print found }'
}

# The release's wheel: the one SHA256SUMS entry named metralectl_cockpit-<version>-py3-none-any.whl.
sums_wheel_name() {
    tr -d '\r' <"$TMP_DIR/SHA256SUMS" | awk '
        NF >= 2 && length($1) == 64 {
            name = $2; sub(/^\*/, "", name); sub(/^\.\//, "", name)
            if (name ~ /^metralectl_cockpit-[0-9][^-]*-py3-none-any\.whl$/ && !(name in seen)) { seen[name] = 1; n++; w = name }
        }
        END { if (n == 1) print w }'
}

fetch_verified() {
    say "  downloading $1"
    download "$BASE_URL/$1" "$TMP_DIR/$1" || die "could not download $BASE_URL/$1"
    fv_want=$(sums_lookup "$1")
    [ -n "$fv_want" ] || die "SHA256SUMS has no (or no unambiguous) entry for $1: refusing to install it"
    fv_got=$(file_sha256 "$TMP_DIR/$1") || die "could not compute the SHA-256 of $1"
    if [ "$fv_got" != "$fv_want" ]; then
        die "SHA-256 mismatch for $1: SHA256SUMS says $fv_want, the download is $fv_got
  (a corrupted or tampered download, or an error page served in its place)"
    fi
}

# --- Python -----------------------------------------------------------------------------------

# The first Python >= 3.10 (the system's python3 first: it is the one its venv package matches).
pick_python() {
    pp_skipped=""
    if [ -n "${METRALECTL_PYTHON:-}" ]; then
        try_python "$METRALECTL_PYTHON" && return 0
    else
        for pp_cand in python3 python3.14 python3.13 python3.12 python3.11 python3.10 python; do
            try_python "$pp_cand" && return 0
        done
    fi
    die "metralectl needs Python 3.10 or newer; found${pp_skipped:- none}. Install python3 (3.10+) and run this again, or set METRALECTL_PYTHON"
}

try_python() {
    command -v "$1" >/dev/null 2>&1 || return 1
    tp_ver=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || return 1
    if "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        PYTHON=$1
        PY_VERSION=$tp_ver
        return 0
    fi
    pp_skipped="$pp_skipped $1 ($tp_ver)"
    return 1
}

# The release platform name is the Python's (an x86_64 Python under Rosetta needs x86_64 wheels).
detect_platform() {
    dp_info=$("$PYTHON" -c 'import platform, sys; print(sys.platform, platform.machine().lower(), platform.libc_ver()[0] or "-")') ||
        die "could not run $PYTHON"
    # shellcheck disable=SC2086 # three words, split on purpose
    set -- $dp_info
    case "$1" in
        linux) dp_os=linux ;;
        darwin) dp_os=macos ;;
        *) die "unsupported operating system '$1' (Linux and macOS here; Windows: install.ps1)" ;;
    esac
    case "$2" in
        x86_64 | amd64) dp_arch=x86_64 ;;
        aarch64 | arm64) [ "$dp_os" = macos ] && dp_arch=arm64 || dp_arch=aarch64 ;;
        *) die "unsupported processor '$2' (x86_64 and aarch64/arm64 are released)" ;;
    esac
    if [ "$dp_os" = linux ] && [ "$3" != glibc ]; then
        die "this Linux does not use glibc (musl/Alpine?): the released dependency wheels need glibc 2.28+"
    fi
    PLATFORM="$dp_os-$dp_arch"
}

check_venv_module() {
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null && return 0
    die "$PYTHON ($PY_VERSION) cannot create virtual environments (no venv/ensurepip module).
  On Debian, Ubuntu and DGX OS: sudo apt install python3-venv   (or python$PY_VERSION-venv)"
}

# The lock's "# python: 3.10 3.11 ..." header: the Python versions it has wheels for.
check_lock_python() {
    cl_list=$(sed -n 's/^# python: //p' "$TMP_DIR/$LOCK" | head -n 1 | tr -d '\r')
    case " $cl_list " in
        *" $PY_VERSION "*) ;;
        *) die "$PYTHON is Python $PY_VERSION; this release has dependency wheels for Python $cl_list only (set METRALECTL_PYTHON)" ;;
    esac
}

# --- install ----------------------------------------------------------------------------------

# A metralectl already at $BIN_LINK that we did not put there (pip --user, a copy) is not ours to
# replace: say so before anything is changed.
check_bin_link_free() {
    if [ -L "$BIN_LINK" ]; then
        cb_target=$(readlink "$BIN_LINK")
        case "$cb_target" in "$DATA_DIR"/*) return 0 ;; esac
        die "$BIN_LINK already exists and points to $cb_target, which this installer did not install: remove it first (or set METRALECTL_INSTALL_DIR)"
    elif [ -e "$BIN_LINK" ]; then
        die "$BIN_LINK already exists and was not installed by this installer (pip install --user?): remove it first (pip uninstall metralectl-cockpit), or set METRALECTL_INSTALL_DIR"
    fi
}

# Runs pip with the settings that would break a venv install cleared (PIP_USER=1 makes pip refuse
# in a venv; PYTHONPATH/PYTHONHOME would mix in another Python's packages).
venv_pip() {
    (
        unset PIP_USER PIP_TARGET PIP_PREFIX PIP_REQUIRE_VIRTUALENV PYTHONPATH PYTHONHOME
        # --no-cache-dir: the wheels are needed once; a cache would leave them in ~/.cache for good.
        exec "$STAGE/bin/python" -m pip --disable-pip-version-check --no-input --no-cache-dir "$@"
    ) >>"$TMP_DIR/pip.log" 2>&1
}

pip_failed() {
    tail -n 25 "$TMP_DIR/pip.log" >&2
    die "$1"
}

# Each install is a new directory venvs/<version>-<time>-<pid>; nothing in a previous one is ever
# touched, so a running metralectl (or the agent) keeps its files. A venv cannot be moved after it
# is made (its scripts name its path), which is why the switch is a symlink, not a renamed venv.
install_stage() {
    CREATED_TOP=$(first_missing_dir "$DATA_DIR/venvs")
    mkdir -p "$DATA_DIR/venvs" || die "cannot create $DATA_DIR/venvs"
    GENERATION="$VERSION-$(date +%Y%m%d%H%M%S)-$$"
    STAGE="$DATA_DIR/venvs/$GENERATION"
    say "  creating $STAGE (Python $PY_VERSION)"
    "$PYTHON" -m venv "$STAGE" >>"$TMP_DIR/pip.log" 2>&1 || pip_failed "could not create a virtual environment with $PYTHON"
    say "  installing the locked dependencies (hash-checked)"
    venv_pip install --require-hashes --only-binary :all: -r "$TMP_DIR/$LOCK" ||
        pip_failed "pip could not install the locked dependencies (see above)"
    say "  installing $WHEEL"
    venv_pip install --no-deps --no-index "$TMP_DIR/$WHEEL" || pip_failed "pip could not install $WHEEL"
    venv_pip check || pip_failed "the installed dependencies do not satisfy metralectl's requirements"
    is_out=$("$STAGE/bin/metralectl" --version 2>&1) || {
        printf '%s\n' "$is_out" >&2
        die "the new metralectl does not start"
    }
    case "$is_out" in *"$VERSION"*) ;; *) die "the new metralectl reports '$is_out', expected $VERSION" ;; esac
}

# The outermost directory `mkdir -p DIR` would create (empty when DIR exists): what a failed first
# install removes again, so it leaves no empty ~/.local/share/metralectl behind.
first_missing_dir() {
    fm_dir=$1
    fm_top=""
    while [ -n "$fm_dir" ] && [ "$fm_dir" != / ] && [ ! -e "$fm_dir" ]; do
        fm_top=$fm_dir
        fm_dir=$(dirname "$fm_dir")
    done
    printf '%s\n' "$fm_top"
}

# replace_link TARGET LINK: point LINK at TARGET in one rename(2), so no moment exists where LINK is
# missing or half-written. Python does the rename: `mv` onto a symlink to a directory would move the
# new link *into* that directory.
replace_link() {
    rl_tmp="$2.new.$$"
    rm -f "$rl_tmp"
    ln -s "$1" "$rl_tmp" || return 1
    "$PYTHON" -c 'import os, sys; os.replace(sys.argv[1], sys.argv[2])' "$rl_tmp" "$2" || {
        rm -f "$rl_tmp"
        return 1
    }
}

# receipt_values KEY: the values of the receipt's KEY=... lines, one per line. The receipt lists what
# this installer made, for --uninstall; a new install carries the older entries forward.
receipt_values() {
    [ -f "$RECEIPT" ] || return 0
    sed -n "s/^$1=//p" "$RECEIPT"
}

install_commit() {
    mkdir -p "$BIN_DIR" || die "cannot create $BIN_DIR"
    ic_old_bin=$(receipt_values bin | head -n 1)
    replace_link "$STAGE" "$DATA_DIR/venv" || die "could not switch $DATA_DIR/venv to the new environment"
    COMMITTED=1
    replace_link "$STAGE/bin/metralectl" "$BIN_LINK" || die "could not link $BIN_LINK"
    # Moved to another METRALECTL_INSTALL_DIR: the old link is ours, take it away.
    if [ -n "$ic_old_bin" ] && [ "$ic_old_bin" != "$BIN_LINK" ] && [ -L "$ic_old_bin" ]; then
        case "$(readlink "$ic_old_bin")" in "$DATA_DIR"/*) rm -f "$ic_old_bin" ;; esac
    fi
    {
        say "# metralectl installer receipt: what --uninstall removes"
        say "version=$VERSION"
        say "venv=$STAGE"
        say "bin=$BIN_LINK"
        receipt_values profile | sed 's/^/profile=/'
        receipt_values unit | sed 's/^/unit=/'
        receipt_values created | sed 's/^/created=/'
        receipt_values completion | sed 's/^/completion=/'
        receipt_values completion_dir | sed 's/^/completion_dir=/'
        receipt_values man | sed 's/^/man=/'
        receipt_values man_dir | sed 's/^/man_dir=/'
    } >"$RECEIPT.new" && mv -f "$RECEIPT.new" "$RECEIPT"
    prune_generations
}

# Keep the current environment and the one before it (a metralectl started before this install may
# still be running from it); remove older ones.
prune_generations() {
    for pg_dir in "$DATA_DIR"/venvs/*; do
        [ -d "$pg_dir" ] || continue
        [ "$pg_dir" = "$STAGE" ] && continue
        [ "$pg_dir" = "${PREVIOUS_VENV:-}" ] && continue
        rm -rf "$pg_dir"
    done
}

# --- PATH -------------------------------------------------------------------------------------

on_path() {
    op_rest="$PATH:"
    while [ -n "$op_rest" ]; do
        op_entry=${op_rest%%:*}
        op_rest=${op_rest#*:}
        # A trailing slash (…/bin/) names the same directory.
        while [ "${op_entry%/}" != "$op_entry" ] && [ "$op_entry" != / ]; do op_entry=${op_entry%/}; done
        [ "$op_entry" = "$1" ] && return 0
    done
    return 1
}

# The profile for the user's login shell, and the line that puts BIN_DIR on PATH in its syntax.
path_line_for_shell() {
    case "$BIN_DIR" in
        "$HOME"/*) pl_dir="\$HOME/${BIN_DIR#"$HOME"/}" ;;
        *) pl_dir=$BIN_DIR ;;
    esac
    case "$(basename "${SHELL:-sh}")" in
        fish)
            PROFILE="$CONFIG_HOME/fish/conf.d/metralectl.fish"
            PATH_LINE="contains -- \"$pl_dir\" \$PATH; or set -gx PATH \$PATH \"$pl_dir\""
            NOW_LINE="set -gx PATH \$PATH \"$pl_dir\""
            ;;
        zsh)
            PROFILE="${ZDOTDIR:-$HOME}/.zshrc"
            PATH_LINE="export PATH=\"\$PATH:$pl_dir\""
            NOW_LINE=$PATH_LINE
            ;;
        bash)
            PROFILE="$HOME/.bashrc"
            PATH_LINE="export PATH=\"\$PATH:$pl_dir\""
            NOW_LINE=$PATH_LINE
            ;;
        *)
            PROFILE="$HOME/.profile"
            PATH_LINE="export PATH=\"\$PATH:$pl_dir\""
            NOW_LINE=$PATH_LINE
            ;;
    esac
}

setup_path() {
    on_path "$BIN_DIR" && return 0
    path_line_for_shell
    case "$BIN_DIR" in
        *'"'* | *'$'* | *'`'* | *\\*)
            say ""
            say "$BIN_DIR is not on your PATH, and its name has characters this installer will not"
            say "put in a shell profile. Add it to PATH yourself."
            return 0
            ;;
    esac
    if [ "$NO_MODIFY_PATH" = 1 ]; then
        say ""
        say "$BIN_DIR is not on your PATH. Add this line to $PROFILE:"
        say ""
        say "    $PATH_LINE"
        say ""
        say "then open a new terminal (or run that line in this one)."
        return 0
    fi
    # Never twice: the exact line already in the profile (from an earlier install, or the user) is
    # left alone.
    if [ -f "$PROFILE" ] && grep -qxF -- "$PATH_LINE" "$PROFILE"; then
        sp_added=0
    else
        mkdir -p "$(dirname "$PROFILE")" || { warn "cannot create $(dirname "$PROFILE")"; return 0; }
        [ -e "$PROFILE" ] || receipt_add created "$PROFILE"    # then --uninstall may delete it
        # A profile whose last line has no newline would get our marker glued onto it.
        if [ -s "$PROFILE" ] && [ -n "$(tail -c 1 "$PROFILE")" ]; then
            printf '\n' >>"$PROFILE"
        fi
        printf '%s\n%s\n' "$PATH_MARKER" "$PATH_LINE" >>"$PROFILE" || { warn "cannot write $PROFILE"; return 0; }
        sp_added=1
    fi
    if [ "$sp_added" = 1 ] || grep -qxF -- "$PATH_MARKER" "$PROFILE"; then
        receipt_add profile "$PROFILE"
    fi
    say ""
    if [ "$sp_added" = 1 ]; then
        say "Added $BIN_DIR to PATH in $PROFILE (new terminals). For this terminal, run:"
    else
        say "$PROFILE already puts $BIN_DIR on PATH (new terminals). For this terminal, run:"
    fi
    say ""
    say "    $NOW_LINE"
}

# --- shell completion -------------------------------------------------------------------------

# The login shell's completion, from the installed command itself (`metralectl completion SHELL`),
# where that shell loads it by itself: bash-completion's user directory, fish's completions
# directory; zsh has no such directory, so .zshrc sources the file (after compinit: guarded). A
# script that does not come out whole is not written; the install stands either way.
setup_completion() {
    sc_shell=$(basename "${SHELL:-sh}")
    case "$sc_shell" in
        bash) sc_file="${BASH_COMPLETION_USER_DIR:-$DATA_HOME/bash-completion}/completions/metralectl" ;;
        fish) sc_file="$CONFIG_HOME/fish/completions/metralectl.fish" ;;
        zsh) sc_file="$DATA_DIR/completion/metralectl.zsh" ;;
        *) return 0 ;;     # sh, dash, ...: no completion to install
    esac
    if [ "$NO_COMPLETION" = 1 ]; then
        say ""
        say "Shell completion: skipped (--no-completion). Later:  metralectl completion $sc_shell"
        return 0
    fi
    case "$sc_file" in
        *'"'* | *'$'* | *'`'* | *\\*)
            say ""
            say "Shell completion: not installed ($sc_file has characters this installer will not"
            say "put in a shell file). Load it yourself:  metralectl completion $sc_shell"
            return 0
            ;;
    esac
    sc_tmp="$sc_file.new.$$"
    sc_top=$(first_missing_dir "$(dirname "$sc_file")")     # what --uninstall may remove again, if empty
    mkdir -p "$(dirname "$sc_file")" || { warn "cannot create $(dirname "$sc_file"); shell completion not installed"; return 0; }
    if ! "$BIN_LINK" completion "$sc_shell" >"$sc_tmp" 2>/dev/null || ! grep -q _METRALECTL_COMPLETE "$sc_tmp"; then
        rm -f "$sc_tmp"
        [ -n "$sc_top" ] && rm -rf "$sc_top"
        warn "\`metralectl completion $sc_shell\` failed; shell completion not installed"
        return 0
    fi
    mv -f "$sc_tmp" "$sc_file" || { rm -f "$sc_tmp"; warn "cannot write $sc_file"; return 0; }
    receipt_add completion "$sc_file"
    [ -n "$sc_top" ] && receipt_add completion_dir "$sc_top"
    say ""
    if [ "$sc_shell" != zsh ]; then
        say "Shell completion: $sc_file (new $sc_shell sessions)."
        return 0
    fi
    case "$sc_file" in
        "$HOME"/*) sc_at="\$HOME/${sc_file#"$HOME"/}" ;;
        *) sc_at=$sc_file ;;
    esac
    sc_line="[ -r \"$sc_at\" ] && (( \$+functions[compdef] )) && . \"$sc_at\""
    sc_profile="${ZDOTDIR:-$HOME}/.zshrc"
    if [ "$NO_MODIFY_PATH" = 1 ]; then
        say "Shell completion: $sc_file. To load it, add this line to $sc_profile (after compinit):"
        say ""
        say "    $sc_line"
        return 0
    fi
    if ! { [ -f "$sc_profile" ] && grep -qxF -- "$sc_line" "$sc_profile"; }; then
        [ -e "$sc_profile" ] || receipt_add created "$sc_profile"
        if [ -s "$sc_profile" ] && [ -n "$(tail -c 1 "$sc_profile")" ]; then
            printf '\n' >>"$sc_profile"
        fi
        printf '%s\n%s\n' "$PATH_MARKER" "$sc_line" >>"$sc_profile" || { warn "cannot write $sc_profile"; return 0; }
    fi
    receipt_add profile "$sc_profile"
    say "Shell completion: $sc_file, loaded by $sc_profile (new zsh sessions, after compinit)."
}

# --- the man page -----------------------------------------------------------------------------

# The wheel's page (<venv>/share/man/man1/metralectl.1, generated from the CLI) copied where man finds
# a user's pages: man-db maps ~/.local/bin on PATH to ~/.local/share/man. A page of someone else's
# there (a link, or a file without the generator's header) is kept. The install stands either way.
setup_man() {
    sm_dir="$DATA_HOME/man/man1"
    sm_file="$sm_dir/metralectl.1"
    if [ ! -f "$STAGE/share/man/man1/metralectl.1" ]; then
        warn "this release carries no man page; \`metralectl --help\` says the same"
        return 0
    fi
    if [ -L "$sm_file" ] || { [ -e "$sm_file" ] && ! grep -q 'Generated by scripts/man-page.py' "$sm_file"; }; then
        say "Man page: kept $sm_file (not written by this installer)."
        return 0
    fi
    sm_top=$(first_missing_dir "$sm_dir")
    mkdir -p "$sm_dir" || { warn "cannot create $sm_dir; man page not installed"; return 0; }
    if ! cat "$STAGE/share/man/man1/metralectl.1" >"$sm_file.new.$$" || ! mv -f "$sm_file.new.$$" "$sm_file"; then
        rm -f "$sm_file.new.$$"
        [ -n "$sm_top" ] && rm -rf "$sm_top"
        warn "cannot write $sm_file; man page not installed"
        return 0
    fi
    receipt_add man "$sm_file"
    [ -n "$sm_top" ] && receipt_add man_dir "$sm_top"
    say "Man page: $sm_file (man metralectl)."
}

uninstall_man() {
    um_made=$(receipt_values man_dir)
    receipt_values man | while IFS= read -r um_file; do
        if [ ! -f "$um_file" ] || [ -L "$um_file" ]; then continue; fi
        if ! grep -q 'Generated by scripts/man-page.py' "$um_file"; then
            say "  kept $um_file (not written by this installer)"
            continue
        fi
        rm -f "$um_file" && say "  removed $um_file"
        printf '%s\n' "$um_made" | while IFS= read -r um_top; do    # the directories made for it, if empty
            case "$um_file" in "$um_top"/*) ;; *) continue ;; esac
            um_dir=$(dirname "$um_file")
            while rmdir "$um_dir" 2>/dev/null && [ "$um_dir" != "$um_top" ]; do um_dir=$(dirname "$um_dir"); done
        done
    done
}

receipt_add() {
    grep -qxF -- "$1=$2" "$RECEIPT" 2>/dev/null || printf '%s=%s\n' "$1" "$2" >>"$RECEIPT"
}

# --- the background agent ---------------------------------------------------------------------

write_unit() {
    case "$BIN_LINK" in
        *'%'* | *'"'* | *\\*)
            warn "the path $BIN_LINK cannot be written into a systemd unit as it is; agent not installed"
            return 1
            ;;
    esac
    mkdir -p "$(dirname "$UNIT_FILE")" || return 1
    {
        say "# Installed by the metralectl installer; \`install.sh --uninstall\` removes it."
        say "[Unit]"
        say "Description=metralectl background agent"
        say ""
        say "[Service]"
        say "Type=simple"
        # The link in ~/.local/bin, not a venv path: it always names the current install, and the
        # process it starts keeps the environment it started from until restarted.
        say "ExecStart=\"$BIN_LINK\" agent"
        say "Restart=on-failure"
        say "RestartSec=5"
        # 75: another agent already runs for this configuration (`metralectl agent start`), or its port is
        # taken by another program: restarting every 5 s would not change that.
        say "RestartPreventExitStatus=75"
        say "Environment=PYTHONUNBUFFERED=1"
        if [ -n "${METRALECTL_CONFIG_DIR:-}" ]; then
            say "Environment=\"METRALECTL_CONFIG_DIR=$METRALECTL_CONFIG_DIR\""
        fi
        say ""
        say "[Install]"
        say "WantedBy=default.target"
    } >"$UNIT_FILE.new" || return 1
    mv -f "$UNIT_FILE.new" "$UNIT_FILE" || return 1
    receipt_add unit "$UNIT_FILE"
}

# Why `systemctl --user` cannot be used here, in words a user can act on.
explain_no_user_manager() {
    say ""
    if [ ! -d /run/systemd/system ]; then
        say "The agent's unit is installed ($UNIT_FILE), but systemd is not running on this machine"
        say "(a container, WSL without systemd, or another init system), so nothing can start it."
        say "Start the agent yourself when you need it:  metralectl agent start"
    else
        say "The agent's unit is installed ($UNIT_FILE), but this shell has no systemd user session"
        say "(XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-<unset>}). That happens after 'sudo su -', 'su', or"
        say "'sudo -u': those do not start a login session for $(id -un)."
        say "Log in as $(id -un) directly (ssh or the desktop) and run:"
        say ""
        say "    systemctl --user daemon-reload && systemctl --user enable --now $UNIT_NAME"
    fi
}

suggest_linger() {
    sl_user=$(id -un)
    sl_linger=$(loginctl show-user "$sl_user" --property=Linger --value 2>/dev/null) || sl_linger=""
    [ "$sl_linger" = yes ] && return 0
    say ""
    say "So that the agent runs without you being logged in (and starts at boot), run once:"
    say ""
    say "    sudo loginctl enable-linger $sl_user"
}

# The agent talks to Docker through /var/run/docker.sock, which needs the 'docker' group in the
# agent's own process. Groups are fixed when a process starts: a user added to 'docker' after their
# shell (or their systemd user manager, which starts the agent) started does not have it there yet.
check_docker_group() {
    [ "$(id -u)" = 0 ] && return 0       # root reaches the socket without the group
    cd_user=$(id -un)
    cd_entry=$(getent group docker 2>/dev/null) || cd_entry=$(grep '^docker:' /etc/group 2>/dev/null) || cd_entry=""
    [ -n "$cd_entry" ] || return 0        # no docker group: `metralectl doctor` explains Docker itself
    cd_gid=$(printf '%s\n' "$cd_entry" | head -n 1 | cut -d: -f3)
    cd_members=$(printf '%s\n' "$cd_entry" | head -n 1 | cut -d: -f4)
    case ",$cd_members," in
        *",$cd_user,"*) ;;
        *)
            [ "$(id -g)" = "$cd_gid" ] && return 0
            command -v docker >/dev/null 2>&1 || [ -S /var/run/docker.sock ] || return 0
            say ""
            say "You are not in the 'docker' group, so metralectl (and the agent) cannot start models:"
            say "    sudo usermod -aG docker $cd_user     then log out and back in"
            return 0
            ;;
    esac
    if ! id -nG | tr ' ' '\n' | grep -qx docker; then
        warn "you were added to the 'docker' group after this shell started: run 'newgrp docker' or log in again before using metralectl here"
    fi
    command -v systemctl >/dev/null 2>&1 || return 0
    cd_pid=$(systemctl show --property=MainPID --value "user@$(id -u).service" 2>/dev/null) || cd_pid=""
    case "$cd_pid" in '' | 0 | *[!0-9]*) return 0 ;; esac
    if [ -r "/proc/$cd_pid/status" ]; then
        cd_groups=$(sed -n 's/^Groups:[[:space:]]*//p' "/proc/$cd_pid/status")
        case " $cd_groups " in *" $cd_gid "*) return 0 ;; esac
        cd_why="your systemd user manager (pid $cd_pid) started before you were added to 'docker'"
    else
        # Cannot see its groups: compare its start with the last change to /etc/group.
        cd_started=$(systemctl show --timestamp=unix --property=ActiveEnterTimestamp --value "user@$(id -u).service" 2>/dev/null | tr -d '@')
        cd_changed=$(stat -c %Y /etc/group 2>/dev/null) || return 0
        case "$cd_started" in '' | *[!0-9]*) return 0 ;; esac
        [ "$cd_changed" -gt "$cd_started" ] || return 0
        cd_why="/etc/group changed after your systemd user manager started, so it may lack the 'docker' group"
    fi
    warn "$cd_why: the agent would get 'permission denied' on /var/run/docker.sock.
  Log out of every session of $cd_user (or: sudo systemctl restart user@$(id -u).service), then
  systemctl --user restart $UNIT_NAME"
}

setup_agent() {
    if [ "$NO_AGENT" = 1 ]; then
        say ""
        say "Background agent: skipped (METRALECTL_NO_AGENT=1)."
        return 0
    fi
    if [ "$(uname -s)" != Linux ]; then
        say ""
        say "Background agent: not set up on $(uname -s) (systemd only); start it with 'metralectl agent start' when needed."
        return 0
    fi
    if ! command -v systemctl >/dev/null 2>&1; then
        say ""
        say "Background agent: this system has no systemd (no systemctl), so it is not installed as a"
        say "service. Start it yourself when needed:  metralectl agent start"
        check_docker_group
        return 0
    fi
    write_unit || { warn "could not write $UNIT_FILE; the agent is not installed"; return 0; }
    if ! systemctl --user show-environment >/dev/null 2>&1; then
        explain_no_user_manager
        [ -d /run/systemd/system ] && suggest_linger
        check_docker_group
        return 0
    fi
    systemctl --user daemon-reload || warn "systemctl --user daemon-reload failed"
    say ""
    if [ "$NO_START" = 1 ]; then
        say "Background agent: unit installed ($UNIT_FILE), not enabled or started (--no-start)."
        say "Start it with:  systemctl --user enable --now $UNIT_NAME"
    elif ! "$BIN_LINK" agent --help >/dev/null 2>&1; then
        # Until a release has the `agent` command, enabling the unit would only make systemd
        # restart a failing process.
        say "Background agent: unit installed ($UNIT_FILE) but not enabled: metralectl $VERSION has no"
        say "'agent' command yet. A later install enables it."
    elif systemctl --user enable "$UNIT_NAME" >/dev/null 2>&1 && systemctl --user restart "$UNIT_NAME"; then
        # restart = start, or pick up the new version when it was already running.
        say "Background agent: running ($UNIT_NAME). Logs: journalctl --user -u $UNIT_NAME"
    else
        warn "could not start $UNIT_NAME; see: systemctl --user status $UNIT_NAME"
    fi
    suggest_linger
    check_docker_group
}

# --- uninstall --------------------------------------------------------------------------------

# Removes exactly what an install made: the environments, the links, the receipt, the agent's unit,
# the PATH lines under our marker. metralectl's config (identity, recipes), the Hugging Face cache
# and ~/.metrale are the user's data and stay.
uninstall() {
    say "Uninstalling metralectl"
    un_bins=$(receipt_values bin)
    [ -n "$un_bins" ] || un_bins=$BIN_LINK
    un_units=$(receipt_values unit)
    [ -n "$un_units" ] || un_units=$UNIT_FILE
    printf '%s\n' "$un_units" | while IFS= read -r un_unit; do
        [ -f "$un_unit" ] || continue
        if ! grep -q "Installed by the metralectl installer" "$un_unit"; then
            say "  kept $un_unit (not written by this installer)"
            continue
        fi
        if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; then
            systemctl --user disable --now "$UNIT_NAME" >/dev/null 2>&1
            rm -f "$un_unit"
            systemctl --user daemon-reload >/dev/null 2>&1
        else
            rm -f "$un_unit"
            say "  (no systemd user session here: if the agent is running, it stops at your next logout,"
            say "   or now with: systemctl --user stop $UNIT_NAME)"
        fi
        say "  removed $un_unit"
    done
    printf '%s\n' "$un_bins" | while IFS= read -r un_bin; do
        if [ -L "$un_bin" ]; then
            case "$(readlink "$un_bin")" in
                "$DATA_DIR"/*) rm -f "$un_bin" && say "  removed $un_bin" ;;
                *) say "  kept $un_bin (not installed by this installer)" ;;
            esac
        elif [ -e "$un_bin" ]; then
            say "  kept $un_bin (not installed by this installer)"
        fi
    done
    un_made=$(receipt_values completion_dir)
    receipt_values completion | while IFS= read -r un_file; do
        [ -f "$un_file" ] || continue
        if ! grep -q _METRALECTL_COMPLETE "$un_file"; then
            say "  kept $un_file (not written by this installer)"
            continue
        fi
        rm -f "$un_file" && say "  removed $un_file"
        # The directories made for it, up to the top one the install created, if nothing else is in them.
        printf '%s\n' "$un_made" | while IFS= read -r un_top; do
            [ -n "$un_top" ] || continue
            case "$un_file" in "$un_top"/*) ;; *) continue ;; esac
            un_dir=$(dirname "$un_file")
            while rmdir "$un_dir" 2>/dev/null && [ "$un_dir" != "$un_top" ]; do un_dir=$(dirname "$un_dir"); done
        done
    done
    uninstall_man
    receipt_values profile | while IFS= read -r un_profile; do
        [ -f "$un_profile" ] || continue
        remove_path_lines "$un_profile" || continue
        say "  removed the PATH line from $un_profile"
        # A profile this installer created goes too, if nothing else was written to it since.
        if [ ! -s "$un_profile" ] && receipt_values created | grep -qxF -- "$un_profile"; then
            rm -f "$un_profile"
        fi
    done
    if [ -d "$DATA_DIR/venvs" ] || [ -L "$DATA_DIR/venv" ] || [ -f "$RECEIPT" ]; then
        rm -rf "$DATA_DIR/venvs" "$DATA_DIR/venv" "$RECEIPT" "$RECEIPT.new"
        rmdir "$DATA_DIR" 2>/dev/null     # only if nothing else lives there
        say "  removed the environments in $DATA_DIR"
    else
        say "  no installation found in $DATA_DIR"
    fi
    say "Kept your data: metralectl's config (${METRALECTL_CONFIG_DIR:-$CONFIG_HOME/metralectl}), the Hugging Face cache, ~/.metrale."
}

# Drops our marker line and the line after it; the file is rewritten in place (cat >), so its owner,
# mode and a symlinked dotfile stay as they were.
remove_path_lines() {
    rp_tmp="$1.metralectl-uninstall.$$"
    awk -v marker="$PATH_MARKER" '
        skip { skip = 0; next }
        $0 == marker { skip = 1; next }
        { print }' "$1" >"$rp_tmp" || { rm -f "$rp_tmp"; return 1; }
    if cmp -s "$1" "$rp_tmp"; then
        rm -f "$rp_tmp"
        return 1
    fi
    cat "$rp_tmp" >"$1"
    rm -f "$rp_tmp"
}

# --- main -------------------------------------------------------------------------------------

cleanup() {
    if [ "${COMMITTED:-0}" != 1 ]; then
        [ -n "${STAGE:-}" ] && rm -rf "$STAGE"
        # Only directories this run created (they held nothing but the stage).
        [ -n "${CREATED_TOP:-}" ] && rm -rf "$CREATED_TOP"
    fi
    [ -n "${TMP_DIR:-}" ] && rm -rf "$TMP_DIR"
}

install() {
    say "Installing metralectl"
    set_base_url
    pick_downloader
    pick_hasher
    pick_python
    detect_platform
    check_venv_module
    check_bin_link_free
    TMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/metralectl-install.XXXXXX") || die "cannot create a temporary directory"
    say "  from $BASE_URL ($PLATFORM)"
    say "  downloading SHA256SUMS"
    download "$BASE_URL/SHA256SUMS" "$TMP_DIR/SHA256SUMS" ||
        die "could not download $BASE_URL/SHA256SUMS: refusing to install anything unverified"
    WHEEL=$(sums_wheel_name)
    [ -n "$WHEEL" ] || die "SHA256SUMS lists no single metralectl wheel: not a metralectl release"
    VERSION=${WHEEL#metralectl_cockpit-}
    VERSION=${VERSION%%-*}
    LOCK="metralectl-$VERSION-$PLATFORM.lock.txt"
    fetch_verified "$WHEEL"
    fetch_verified "$LOCK"
    check_lock_python
    # The environment in use now (what `venv` points to) survives the pruning after the switch.
    PREVIOUS_VENV=$(readlink "$DATA_DIR/venv" 2>/dev/null) || PREVIOUS_VENV=$(receipt_values venv | head -n 1)
    install_stage
    install_commit
    say "metralectl $VERSION installed: $BIN_LINK"
    setup_path
    setup_completion
    setup_man
    setup_agent
    say ""
    say "Done. Try:  metralectl list"
}

main() {
    COMMITTED=0
    STAGE=""
    CREATED_TOP=""
    TMP_DIR=""
    CURL_PROTO=""
    parse_args "$@"
    # After the arguments: bash 3.2 (macOS's sh) calls an empty "$@" unbound under set -u.
    set -u
    refuse_root
    set_paths
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    need_cmd mkdir
    need_cmd awk
    need_cmd sed
    need_cmd tr
    if [ "$MODE" = uninstall ]; then
        uninstall
    else
        install
    fi
}

{ main "$@"; }
