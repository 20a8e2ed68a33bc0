#!/usr/bin/env bash
# Download, on a machine with a package index, every wheel the lent H200 needs for
# run_tfserve_bench.sh (it has no internet): the web stack of `transformers serve`, metralectl
# itself (built from this tree) with the dependencies it lacks there, and AIPerf 0.13.0 with the
# part of its dependencies `aiperf profile` imports. Into .whl/ (ignored by git); carry it to the
# device with carry: [".whl"]. Wheels for CPython 3.12 on manylinux x86_64, the H200's Python.
# Fails, and says so, when the folder would exceed the device's carry limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${WHEEL_DIR:-.whl}"
LIMIT_MIB=60  # the device tool carries 64 MiB in all; leave room for anything else carried
HERE=benchmarks/h200
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_34_x86_64 --platform any)
PIP=(python3 -m pip --disable-pip-version-check)

rm -rf "$DEST"
mkdir -p "$DEST"
echo "fetch_wheels: building the metralectl wheel from this tree" >&2
"${PIP[@]}" wheel -q --no-deps . -w "$DEST"
ours=("$DEST"/metralectl_cockpit-*.whl)

echo "fetch_wheels: downloading the serving stack, metralectl's dependencies and AIPerf's runtime set" >&2
# One resolve for all three groups, so the versions agree with each other. accelerate goes without
# its dependencies: they are torch & co., which the H200 has (resolving them would fetch GBs of CUDA).
serve_reqs=$(mktemp)
trap 'rm -f "$serve_reqs"' EXIT
grep -v '^accelerate' "$HERE/serve-requirements.txt" >"$serve_reqs"
"${PIP[@]}" download -q "${TARGET[@]}" -d "$DEST" -r "$serve_reqs" -r "$HERE/aiperf-runtime.txt" "${ours[0]}"
"${PIP[@]}" download -q "${TARGET[@]}" -d "$DEST" --no-deps "aiperf==0.13.0" accelerate

# What the H200 already has, and must keep: a newer huggingface_hub in the venv would shadow the
# system one that its transformers 5.17 requires (< 2); torch & co. are GBs. Installing offline
# fails loudly if one of these turns out to be needed after all.
for name in torch transformers tokenizers huggingface_hub hf_xet numpy safetensors sentencepiece triton \
            nvidia_ sympy networkx mpmath; do
  rm -f "$DEST/$name"*.whl
done

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
wheels=("$DEST"/*.whl)
count=${#wheels[@]}
mib=$(python3 -c "print(f'{$total / 2**20:.1f}')")
echo "fetch_wheels: $count wheels, $mib MiB in $DEST/" >&2
find "$DEST" -name '*.whl' -printf '%s %p\n' | sort -rn | awk '{printf "  %8.1f KiB  %s\n", $1/1024, $2}' > "$DEST/MANIFEST.txt"
head -12 "$DEST/MANIFEST.txt" >&2
if [ "$total" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "fetch_wheels: FAILED: $mib MiB is over the $LIMIT_MIB MiB budget (the device carries 64 MiB)" >&2
  exit 1
fi
echo "$mib"
