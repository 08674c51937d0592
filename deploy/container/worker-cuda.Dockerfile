# fusor-worker for NVIDIA GPUs (also measures on the CPU with --backend cpu).
#   docker build -f deploy/container/worker-cuda.Dockerfile -t fusor-worker-cuda:0.1.0 .
# Run with the NVIDIA container toolkit (the driver comes from the host):
#   docker run --gpus '"device=0"' fusor-worker-cuda:0.1.0 --scheduler HOST:7788
# It runs as user and group 10001 (numeric, for Kubernetes' runAsNonRoot). A worker serves no port: its
# health is the scheduler's view of it (`fusor workers`), so the image has no HEALTHCHECK.
# The worker compiles candidates at run time (NVRTC for GPUs, c++ for the
# CPU), so the image keeps the CUDA runtime libraries and a C++ compiler.
ARG CUDA_PACKAGE_VERSION=13-0

FROM debian:12 AS cuda
ARG CUDA_PACKAGE_VERSION
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/
RUN dpkg -i /tmp/cuda-keyring_1.1-1_all.deb && apt-get update

FROM cuda AS build
ARG CUDA_PACKAGE_VERSION
WORKDIR /src
COPY . .
RUN DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "cuda-toolkit-${CUDA_PACKAGE_VERSION}" \
 && ./deploy/install-deps.sh \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFUSOR_BUILD_TESTS=OFF \
      -DCUDAToolkit_ROOT=/usr/local/cuda \
 && cmake --build /build -j "$(nproc)" --target fusor-worker

FROM cuda
ARG CUDA_PACKAGE_VERSION
RUN DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "cuda-nvrtc-${CUDA_PACKAGE_VERSION}" "cuda-cudart-${CUDA_PACKAGE_VERSION}" "libcublas-${CUDA_PACKAGE_VERSION}" \
      libgrpc++1.51 libprotobuf32 libsqlite3-0 libspdlog1.10 libabsl20220623 libonnx1 libyaml-cpp0.7 \
      g++ libopenblas-openmp-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 fusor \
 && useradd --system --uid 10001 --gid 10001 --create-home fusor
COPY --from=build /build/worker/fusor-worker /usr/local/bin/
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/fusor-worker"]
