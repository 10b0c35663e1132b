# syntax=docker/dockerfile:1
#
# shardq in a container:
#
#   docker build -t shardq .
#   docker run -p 127.0.0.1:1883:1883 -p 127.0.0.1:8990:8990 -v shardq-data:/data \
#     -e SHARDQ_ALLOW_ANONYMOUS=true -e SHARDQ_ADMIN_TOKEN="$(head -c 32 /dev/urandom | base64)" shardq
#
# The node listens on every address of the container, so it needs
# credentials to start: users (SHARDQ_USERS_FILE, a users file mounted in
# the container; see shardq passwd) or SHARDQ_ALLOW_ANONYMOUS=true, and
# SHARDQ_ADMIN_TOKEN for the admin API. Without them it exits, saying which.
#
# The build stage compiles a static binary (no cgo); the image holds only
# that binary on distroless's static base (CA certificates, tzdata, no shell,
# no curl), run as the unprivileged user nonroot (65532), with its data in
# the volume /data. The health check is shardq's own: `shardq health` asks
# the node's /healthz (which needs no token) on the port SHARDQ_HTTP names.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# VERSION and COMMIT end up in `shardq version`: docker build --build-arg
# VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) .
ARG VERSION=devel
ARG COMMIT=
ARG TARGETOS=linux
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" -o /out/shardq ./cmd/shardq \
    && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/shardq /usr/local/bin/shardq
# The volume's mount point, owned by nonroot so that a new volume is too.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV SHARDQ_DATA_DIR=/data \
    SHARDQ_MQTT=:1883 \
    SHARDQ_WS=:8083 \
    SHARDQ_HTTP=:8990
VOLUME /data
# MQTT, MQTT over WebSocket, HTTP (metrics, health, admin API).
EXPOSE 1883 8083 8990
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/shardq", "health", "--timeout", "4s"]
ENTRYPOINT ["/usr/local/bin/shardq"]
CMD ["serve"]
