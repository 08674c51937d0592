# fusor-scheduler: the gRPC scheduler and its SQLite tuning database.
#   docker build -f deploy/container/scheduler.Dockerfile -t fusor-scheduler .
# The database lives in /var/lib/fusor (mount a volume there).
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
 && useradd --system --home-dir /var/lib/fusor --create-home fusor
COPY --from=build /build/server/fusor-scheduler /build/client/fusor /usr/local/bin/
USER fusor
EXPOSE 7788 9464
VOLUME /var/lib/fusor
ENTRYPOINT ["/usr/local/bin/fusor-scheduler", "--listen", "0.0.0.0:7788", "--db", "/var/lib/fusor/tuning.db", \
            "--metrics-listen", "0.0.0.0:9464"]
