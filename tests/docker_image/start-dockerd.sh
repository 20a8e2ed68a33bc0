#!/usr/bin/env bash
# Start a Docker daemon for the integration tests if none answers, and wait for it.
#
# Used by CI (runs as root) and by developers. Idempotent: when `docker info` already answers,
# it does nothing. Installs docker.io from Debian's packages when dockerd is missing and we are
# root (a fresh CI machine has nothing installed by hand).
#
# Environment:
#   DOCKERD_WAIT_S   seconds to wait for `docker info` (default 30)
#   DOCKERD_LOG      where dockerd's output goes (default /tmp/metralectl-dockerd.log)
#   DOCKERD_NO_INSTALL=1  never run apt-get
set -euo pipefail

WAIT_S="${DOCKERD_WAIT_S:-30}"
LOG="${DOCKERD_LOG:-/tmp/metralectl-dockerd.log}"

if docker info >/dev/null 2>&1; then
  echo "start-dockerd: daemon already running ($(docker info --format '{{.ServerVersion}}' 2>/dev/null))"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && [ "${DOCKERD_NO_INSTALL:-0}" != "1" ] && command -v apt-get >/dev/null 2>&1; then
    echo "start-dockerd: dockerd not found; installing docker.io"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq docker.io; } >/tmp/metralectl-apt-docker.log 2>&1; then
      tail -n 30 /tmp/metralectl-apt-docker.log >&2
      echo "start-dockerd: installing docker.io failed" >&2
      exit 1
    fi
  else
    echo "start-dockerd: dockerd not installed (apt-get install -y docker.io as root)" >&2
    exit 1
  fi
fi

if [ "$(id -u)" != "0" ]; then
  echo "start-dockerd: no daemon answers and we are not root; cannot start dockerd" >&2
  exit 1
fi

# Is the pid in dockerd's pid file a live (not zombie) dockerd?
dockerd_alive() {
  local pid state
  pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "dockerd" ] || return 1
  state="$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null || true)"
  [ "$state" != "Z" ] && [ "$state" != "X" ]
}

if ! dockerd_alive; then
  # A stale pid file from a dead daemon makes dockerd refuse to start.
  rm -f /var/run/docker.pid
  echo "start-dockerd: starting dockerd (log: $LOG)"
  # setsid: detach from this script's process group so CI's shell exiting does not kill it.
  setsid nohup dockerd --host unix:///var/run/docker.sock >"$LOG" 2>&1 < /dev/null &
else
  echo "start-dockerd: dockerd (pid $(cat /var/run/docker.pid)) is running but not answering yet"
fi

deadline=$(( $(date +%s) + WAIT_S ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  if docker info >/dev/null 2>&1; then
    echo "start-dockerd: daemon ready ($(docker info --format '{{.ServerVersion}}' 2>/dev/null))"
    exit 0
  fi
  sleep 0.5
done
echo "start-dockerd: docker info did not answer within ${WAIT_S}s; last log lines:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
