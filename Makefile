# Targets for working on shardq. `make test` is the test command of the README;
# .ci/run runs it on a fresh machine.

GO ?= go
FUZZTIME ?= 20s
# VERSION and COMMIT are stamped into the binary: `shardq version` prints them.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# PLATFORMS are the GOOS/GOARCH pairs `make cross` builds, without cgo.
PLATFORMS ?= linux/amd64 linux/arm64

.PHONY: all build cross test helm-check chaos bench bench-compare fuzz lint verify clean proto

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/shardq ./cmd/shardq

# cross builds static binaries, bin/shardq-linux-amd64 and so on.
cross:
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=bin/shardq-$$os-$$arch; \
		echo "$(GO) build $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $$out ./cmd/shardq; \
	done

test: helm-check
	$(GO) test -race -timeout 20m ./...

# helm-check lints and renders the Helm chart deploy/helm/shardq and checks
# what it makes, without a Kubernetes cluster. deploy/helm is a module of
# its own, so that shardq's go.mod does not carry Helm and the Kubernetes
# libraries; nothing in it runs concurrently, hence no -race, which would
# instrument all of them.
helm-check:
	cd deploy/helm && $(GO) test ./...

# chaos runs the fault test TestNemesis for DURATION (default 60m): three
# nodes and etcd in network namespaces (root, iproute2 and nftables) under
# load, cycles of mixed faults, each cycle's history checked; it writes
# docs/FAULTS.md. SEED repeats a schedule; SHARDQ_CHAOS_KINDS (names of
# fault kinds, comma-separated) deals only those. Without the race
# detector, so that the load is the nodes' own.
CHAOS_TIMEOUT ?= 24h
chaos:
	SHARDQ_CHAOS_DURATION=$(or $(DURATION),60m) SHARDQ_CHAOS_SEED=$(SEED) \
	SHARDQ_CHAOS_REPORT=$(CURDIR)/docs/FAULTS.md \
	SHARDQ_CHAOS_COMMAND="make chaos DURATION=$(or $(DURATION),60m)$(if $(SEED), SEED=$(SEED))" \
	$(GO) test -count=1 -v -run '^TestNemesis$$' -timeout $(CHAOS_TIMEOUT) ./cluster/

# proto regenerates cluster/clusterpb from cluster.proto: protoc (Debian's
# protobuf-compiler) and the Go plugins, at the versions of the checked-in
# code, installed into $(PROTO_BIN).
PROTO_BIN ?= $(CURDIR)/bin/proto
proto:
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
	cd cluster/clusterpb && PATH=$(PROTO_BIN):$$PATH protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative cluster.proto

bench:
	$(GO) test -run '^$$' -bench . -benchtime 5s ./bench/... ./broker/...

# bench-compare measures shardq's durable cycle against vanilla mochi and
# mosquitto pub/sub on this machine and writes docs/BENCHMARKS.md. ROUNDS,
# DURATION, WARMUP, BENCH_ARGS and OUT tune it (scripts/bench-compare.sh).
bench-compare:
	GO=$(GO) ./scripts/bench-compare.sh

# Each fuzz target runs for FUZZTIME; found crashers land in testdata/fuzz.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseTopic$$' -fuzztime $(FUZZTIME) ./queue
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./storage/badger
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEntry$$' -fuzztime $(FUZZTIME) ./storage/badger
	$(GO) test -run '^$$' -fuzz '^FuzzACL$$' -fuzztime $(FUZZTIME) ./auth
	$(GO) test -run '^$$' -fuzz '^FuzzParseUsers$$' -fuzztime $(FUZZTIME) ./auth

# STATICCHECK is run from the module proxy at a fixed version.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-ed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# verify also fails when go.mod or go.sum are not tidy, printing the difference.
verify: lint
	$(GO) mod tidy -diff

clean:
	rm -rf bin
