# offer-signer container image.
#
# What CI proves and what it does not: CI (.ci/run) runs, on Debian 12 with Swift 6.3.1, the
# builder command below, `swift build -c release --product offer-signer --static-swift-stdlib`,
# then `swift test`; Scripts/benchmark.sh uses the same build command. CI does not build this
# image (there is no Docker engine on CI's machines), so `docker build` itself has not been run.
# `ldd` of that binary lists only libsqlite3.so.0, libstdc++.so.6, libm, libgcc_s and libc (the
# Swift runtime and Foundation are linked in statically), hence the runtime stage below.
#
#   docker build -t offer-signer .
#
# Once, on a new data volume: the directory of the checkpoint and registry files (the floors a
# database writer cannot lower; they cannot sit beside the read-only master key). It is not
# part of the image, so a container run without the data volume stops at start rather than
# starting from empty floors. For full protection give them a volume the database's writers
# cannot write (Docs/Audit.md).
#   docker run --rm -v offer-signer-data:/var/lib/offer-signer --entrypoint mkdir offer-signer \
#     -m 0700 /var/lib/offer-signer/floor
#
# Keys are imported with the same image (see keys.example and Docs/Operations.md), e.g.:
#   docker run --rm -v offer-signer-data:/var/lib/offer-signer -v /etc/offer-signer:/etc/offer-signer:ro \
#     offer-signer keys import --key-id ABCDE12345 --bundle-id com.example.app \
#       --issuer-id <issuer-id> --file /etc/offer-signer/keys/AuthKey_ABCDE12345.p8
#
# Then the service:
#   docker run -d -p 8080:8080 \
#     -v offer-signer-data:/var/lib/offer-signer \
#     -v /etc/offer-signer:/etc/offer-signer:ro \
#     offer-signer
#
# The files under /etc/offer-signer must be mode 0600 and owned by the container's user
# (uid 10001 below), or offer-signer refuses them. `serve --dev` does not fit a container: it
# binds loopback only and refuses OFFER_SIGNER_HOST=0.0.0.0.

# ---- Build ----------------------------------------------------------------------------
FROM swift:6.3 AS builder

# GRDB links the system SQLite.
RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get update \
    && apt-get install -y --no-install-recommends libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Resolve dependencies first so this layer is cached while only sources change. The client
# package (Client/) is a path dependency of the root: its manifest is needed to resolve.
COPY Package.swift ./
COPY Client/Package.swift Client/
RUN swift package resolve
COPY . .
RUN swift build -c release --product offer-signer --static-swift-stdlib \
    && install -D -m 0755 "$(swift build -c release --show-bin-path)/offer-signer" /out/offer-signer

# ---- Run ------------------------------------------------------------------------------
# The same distribution as the builder (the binary needs that glibc); the Swift runtime is
# linked statically, so the slim image only adds SQLite, CA certificates and curl (health check).
FROM swift:6.3-slim

RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get update \
    && apt-get install -y --no-install-recommends libsqlite3-0 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/offer-signer --shell /usr/sbin/nologin offer-signer \
    && install -d -m 0700 -o offer-signer -g offer-signer /var/lib/offer-signer \
    && install -d -m 0700 -o offer-signer -g offer-signer /etc/offer-signer

COPY --from=builder /out/offer-signer /usr/local/bin/offer-signer

# The store (SQLite, writable) and the keys (master key and .p8 files, read-only).
VOLUME ["/var/lib/offer-signer", "/etc/offer-signer"]

ENV OFFER_SIGNER_HOST=0.0.0.0 \
    OFFER_SIGNER_PORT=8080 \
    OFFER_SIGNER_STORE=/var/lib/offer-signer/offer-signer.sqlite \
    OFFER_SIGNER_MASTER_KEY_FILE=/etc/offer-signer/master.key \
    OFFER_SIGNER_CHECKPOINT_FILE=/var/lib/offer-signer/floor/served.checkpoint \
    OFFER_SIGNER_REGISTRY_FILE=/var/lib/offer-signer/floor/served.registry

USER offer-signer
WORKDIR /var/lib/offer-signer
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${OFFER_SIGNER_PORT}/healthz" || exit 1

ENTRYPOINT ["offer-signer"]
CMD ["serve"]
