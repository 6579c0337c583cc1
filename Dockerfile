# Tributary runners: source-runner and sink-runner in one image.
#   docker build -t tributary:local .
#   docker run --rm tributary:local source-runner --help

FROM rust:1.88-bookworm AS builder
# Native build deps of rdkafka-sys: librdkafka is built from source (cmake,
# perl), its TLS links the system's OpenSSL (libssl-dev, found through
# pkg-config) and its OIDC token client libcurl (libcurl4-openssl-dev), as
# scripts/install sets up outside Docker.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake perl pkg-config libssl-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p source-runner -p sink-runner \
 && mkdir -p /out \
 && cp target/release/source-runner target/release/sink-runner /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libcurl4 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home tributary
COPY --from=builder /out/source-runner /out/sink-runner /usr/local/bin/
USER tributary
CMD ["source-runner", "--help"]
