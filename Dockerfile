# osprey-server in a container. Multi-stage: the build stage has Debian 12's -dev packages and builds only the server
# (`make server`); the runtime stage has the server binary, the shared libraries it links (runtime packages only),
# a non-root user and a health check. Build and run:
#   docker build -t osprey-server .
#   docker run -p 8000:8000 -p 8001:8001 -v $PWD/demo-models:/models osprey-server
# Without a registry, a Debian 12 base image can be made with debootstrap + `docker import` and named debian:12.
FROM debian:12 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      libprotobuf-dev protobuf-compiler libonnx-dev nlohmann-json3-dev libcli11-dev python3-venv \
      libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev libwebp-dev libboost-dev libspdlog-dev libgrpc++-dev protobuf-compiler-grpc \
      libgtest-dev libgmock-dev \
    && rm -rf /var/lib/apt/lists/*
# oneDNN 3 is not a Debian package: PyPI's CPU build (what scripts/setup installs into .venv), in a venv of its own.
RUN python3 -m venv /opt/onednn \
    && /opt/onednn/bin/pip install --no-cache-dir --no-deps onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0
WORKDIR /src
COPY CMakeLists.txt Makefile ./
COPY cmake cmake
COPY include include
COPY src src
COPY tests tests
COPY fuzz fuzz
COPY bench bench
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDNNL_ROOT=/opt/onednn && cmake --build build -j "$(nproc)" --target osprey-server \
    && strip build/bin/osprey-server

FROM debian:12 AS runtime
# The runtime halves of the -dev packages above: exactly what `ldd osprey-server` lists.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libprotobuf32 libonnx1 libturbojpeg0 libjpeg62-turbo libspng0 libwebp7 libspdlog1.10 libfmt9 libgrpc++1.51 \
      libgrpc29 libabsl20220623 libc-ares2 libre2-9 libssl3 ocl-icd-libopencl1 libgomp1 zlib1g curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin osprey
COPY --from=build /src/build/bin/osprey-server /usr/local/bin/osprey-server
# The server's RUNPATH names /opt/onednn/lib (where the build stage linked it).
COPY --from=build /opt/onednn/lib/libdnnl.so.3 /opt/onednn/lib/libdnnl.so.3
USER 10001
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/v2/health/live || exit 1
ENTRYPOINT ["osprey-server"]
CMD ["--model-repository", "/models", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001", \
     "--log-format", "json"]
