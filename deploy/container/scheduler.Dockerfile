# fusor-scheduler: the gRPC scheduler and its SQLite tuning database.
#   docker build -f deploy/container/scheduler.Dockerfile -t fusor-scheduler:0.1.0 .
# The database lives in /var/lib/fusor (mount a volume there). It runs as user and group 10001 (numeric,
# so that Kubernetes' runAsNonRoot can verify it). The health check asks the scheduler's gRPC health
# service; with TLS on, give the container FUSOR_TLS_CA (and FUSOR_TLS_CERT, FUSOR_TLS_KEY for mutual TLS).
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN ./deploy/install-deps.sh \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFUSOR_BUILD_TESTS=OFF \
 && cmake --build /build -j "$(nproc)" --target fusor-scheduler fusor

FROM debian:12
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libsqlite3-0 libspdlog1.10 libabsl20220623 libonnx1 libyaml-cpp0.7 \
      libgomp1 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 fusor \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/fusor --create-home fusor
COPY --from=build /build/server/fusor-scheduler /build/client/fusor /usr/local/bin/
USER 10001:10001
EXPOSE 7788 9464
VOLUME /var/lib/fusor
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s \
  CMD ["/usr/local/bin/fusor", "--server", "127.0.0.1:7788", "--timeout", "5", "health"]
ENTRYPOINT ["/usr/local/bin/fusor-scheduler", "--listen", "0.0.0.0:7788", "--db", "/var/lib/fusor/tuning.db", \
            "--metrics-listen", "0.0.0.0:9464"]
