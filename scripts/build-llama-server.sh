#!/usr/bin/env bash
# Moved to images/build-llama-server.sh, beside the image descriptions it builds for (it travels in the wheel
# with them, so an installed metralectl can build the demo's image: images/build-llama-cpp-cpu.sh). This name
# stays for the commands and docs that use it.
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../images/build-llama-server.sh" "$@"
