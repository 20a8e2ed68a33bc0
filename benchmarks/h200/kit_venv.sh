#!/usr/bin/env bash
# Sourced by the H200 run scripts: `kit_venv VENV` makes VENV (once) with metralectl from the kit's wheel and gguf,
# --system-site-packages so the device's pynvml, numpy, typer... serve; needs KIT, PYTHON and a `note` function.
# The device's python3 is itself a venv: its site-packages goes into ours by a .pth file. Returns 1 on failure.
kit_venv() {
  local venv="$1"
  [ -x "$venv/bin/metralectl" ] && return 0
  note "venv with the kit's metralectl wheel (--system-site-packages: pynvml, numpy, typer... are the device's)"
  rm -rf "$venv"
  "$PYTHON" -m venv --system-site-packages "$venv" || return 1
  local parent_site
  parent_site="$("$PYTHON" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')"
  [ -n "$parent_site" ] && "$venv/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/parent-site.pth', 'w').write(sys.argv[1] + '\n')" "$parent_site"
  local pipi=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$KIT/wheels")
  "${pipi[@]}" "$KIT"/wheels/metralectl_cockpit-*.whl || { note "FAILED: installing metralectl"; rm -rf "$venv"; return 1; }
  "${pipi[@]}" --no-deps "$KIT"/wheels/gguf-*.whl || { note "FAILED: installing gguf"; rm -rf "$venv"; return 1; }
}
