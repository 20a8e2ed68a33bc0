#!/usr/bin/env bash
# Set up a development machine (or CI) from nothing: system packages the integration tests use,
# then a project virtual environment (.venv, or $METRALECTL_VENV) holding metralectl itself (editable,
# with test extras) and the real-engine tests' packages. Safe to run again.
#
# The venv, not the system Python: DGX OS / Ubuntu 24.04 refuse pip installs there (PEP 668,
# "externally-managed-environment"), and test tools must not land in a user's environment.
# A user does not need this script: install/install.sh or `uv tool install metralectl-cockpit`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "bootstrap: $*" >&2; }   # what it is doing, before each step that is quiet for a while

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# docker.io: the real daemon the lifecycle tests drive; busybox-static: the rootfs of the locally
# built test-engine image (no registry is reachable); docker-registry: a local registry for image
# pulls; iproute2: network namespaces standing in for a second node; tmux: drives the TUI end to
# end; shellcheck + dash: the installer is checked and run under a strict POSIX shell.
need=()
command -v dockerd >/dev/null || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v ip >/dev/null || need+=(iproute2)
command -v tmux >/dev/null || need+=(tmux)
command -v iptables >/dev/null || need+=(iptables)   # the two-node test's firewall rule (node 2's namespace)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v dash >/dev/null || need+=(dash)
command -v zsh >/dev/null || need+=(zsh)      # the installer's PATH line is sourced in each shell it writes for
command -v fish >/dev/null || need+=(fish)
# chromium + chromium-driver: the control-plane page's browser test (tests/integration/test_page_chromium.py,
# headless, driven by Selenium through Debian's own chromedriver: nothing is downloaded)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# cmake + ninja-build + g++: llama.cpp's llama-server is built from source for the real-engine tests
# (scripts/build-llama-server.sh; no registry serves its image here)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v docker-compose >/dev/null || need+=(docker-compose)   # `export compose` run for real (Debian's 1.29)
command -v node >/dev/null || need+=(nodejs)   # runs the page's safetext.js and joblog.js in the unit tests
# python3-venv: Debian/Ubuntu ship `venv` without ensurepip; the project venv needs it
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if as_root true 2>/dev/null; then
    say "apt-get update, then installing ${#need[@]} Debian packages: ${need[*]} (quiet; a minute or more on a fresh machine)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    say "Debian packages installed"
  else
    say "cannot install ${need[*]} without root; the Docker tests will be skipped"
  fi
fi

# tests/realengines/requirements.txt: the real-engine tests' packages (Hugging Face `transformers serve`
# on CPU: torch, transformers, fastapi, uvicorn, openai; `gguf` for llama.cpp's test model). Test-only, never metralectl's dependencies;
# resolved together with ours so neither side downgrades the other. METRALECTL_SKIP_REALENGINES=1
# leaves them out (those tests then skip, except under CI where they fail).
realengines=(-r tests/realengines/requirements.txt)
[ "${METRALECTL_SKIP_REALENGINES:-}" = 1 ] && realengines=()
VENV=${METRALECTL_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$VENV"
  say "creating the virtual environment $VENV ($(python3 --version 2>&1))"
  python3 -m venv "$VENV" || { say "could not create $VENV (Debian/Ubuntu: apt install python3-venv)"; exit 1; }
fi
if [ ${#realengines[@]} -gt 0 ]; then
  say "pip: installing metralectl (editable) with its test extras and the real-engine tests' packages (CPU torch, transformers: large; minutes on a first run) into $VENV"
else
  say "pip: installing metralectl (editable) with its test extras into $VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' "${realengines[@]}"
say "done ($("$VENV/bin/metralectl" --version) in $VENV; tests: $VENV/bin/python -m pytest)"
