# syntax=docker/dockerfile:1
#
# telha-cascade worker image.
#
#   docker buildx build \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/telha/telha-cascade:<version> --push .
#
# Static Go binaries (CGO_ENABLED=0) on distroless/static, running as the
# non-root user 65532 (the Helm chart's default uid). The image holds
# /telha-worker (the entrypoint) and /telha-enqueue (the publishing tool).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG REVISION=unknown
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}"; \
    GOOS="${TARGETOS:-linux}" GOARCH="${TARGETARCH:-amd64}" \
      go build -trimpath -ldflags "${ldflags}" -o /out/telha-worker ./cmd/worker; \
    GOOS="${TARGETOS:-linux}" GOARCH="${TARGETARCH:-amd64}" \
      go build -trimpath -ldflags "${ldflags}" -o /out/telha-enqueue ./cmd/enqueue; \
    mkdir -p /out/data

FROM gcr.io/distroless/static:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="telha-cascade" \
      org.opencontainers.image.description="NATS JetStream worker performing tombstone cascades on a Pebble temporal graph store" \
      org.opencontainers.image.source="https://github.com/telha/telha-cascade" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/telha-worker /telha-worker
COPY --from=build /out/telha-enqueue /telha-enqueue
# /data exists in the image and belongs to the runtime user, so that a
# volume created from it (docker run without a bind mount) is writable.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME ["/data"]
EXPOSE 8080
ENTRYPOINT ["/telha-worker"]
CMD ["--data-dir=/data"]
