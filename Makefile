# lizard — build, run and test on a Debian 12 (bookworm) host, as root.
#
#   make run     install what is needed, build, build base, serve (the other templates build in the background)
#   make test    the same setup, then every test (scripts/test.sh)
#   make cluster a three-node cluster on this machine (make cluster-down stops it)
#   make deps | build | templates | bench | package | image | proto | clean
SHELL := /bin/bash
.DEFAULT_GOAL := build

GO            ?= go
BIN           ?= bin
CACHE         ?= /var/cache/lizard
TEMPLATE_DIR  ?= $(CACHE)/templates
RUNSC_VERSION ?= v0.0.0-20260905035102-160fafc42237
# runsc is built once per version into $(CACHE)/runsc-<12-char commit>.
RUNSC_SHORT   := $(lastword $(subst -, ,$(RUNSC_VERSION)))
RUNSC         ?= $(CACHE)/runsc-$(RUNSC_SHORT)
# Extra flags for `lizard serve`.
SERVE_FLAGS   ?=

# The built-in templates `make templates` builds (each only when missing).
# claude and codex (the prompt schedules' agents) are left out: each is
# node's 370 Debian packages plus a few hundred MB from the npm registry,
# 20-28 min on the 2-core machine under load; `make templates
# TEMPLATES="claude codex"` builds them, and TestSchedulePrompt runs then.
TEMPLATES     ?= base python node interpreter desktop

# versitygw, the S3 gateway the object-store tests start, installed into the
# cache by `make deps`.
VERSITYGW_VERSION ?= v1.8.0
VERSITYGW     := $(CACHE)/tools/versitygw-$(VERSITYGW_VERSION)/versitygw

TEST_ENV := LIZARD_TEMPLATE_DIR=$(TEMPLATE_DIR) LIZARD_RUNSC=$(RUNSC) LIZARD_VERSITYGW=$(VERSITYGW)

# `make package`: the Debian package, built with nfpm at a pinned version
# (installed once into the cache with go install).
DIST          ?= dist
NFPM_VERSION  ?= v2.45.2
NFPM          := $(CACHE)/tools/nfpm-$(NFPM_VERSION)/nfpm
VERSION       ?= 0.0.0+git$(shell git log -1 --format=%cd.%h --date=format:%Y%m%d 2>/dev/null || echo unknown)
DEB_ARCH      ?= $(shell $(GO) env GOARCH)

.PHONY: deps build templates run test bench bench-cluster package image proto clean dashboard-vendor cluster cluster-down

# `make proto`: regenerates the envd Connect code (internal/envd) from its
# .proto files with Debian's protoc and pinned Go plugins.
PROTOC_GEN_GO_VERSION      ?= v1.36.12
PROTOC_GEN_CONNECT_VERSION ?= v1.19.1
PROTO_TOOLS                := $(CACHE)/tools/proto-$(PROTOC_GEN_GO_VERSION)-$(PROTOC_GEN_CONNECT_VERSION)

deps:
	CACHE=$(CACHE) RUNSC_VERSION=$(RUNSC_VERSION) VERSITYGW_VERSION=$(VERSITYGW_VERSION) scripts/install-deps.sh

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/lizard ./cmd/lizard
	CGO_ENABLED=0 $(GO) build -o $(BIN)/lizard-agent ./cmd/lizard-agent

templates: deps build
	set -e; for t in $(TEMPLATES); do \
		$(BIN)/lizard template build $$t --if-missing --template-dir $(TEMPLATE_DIR) --runsc $(RUNSC); \
	done

# `make run` builds base alone, then serves: the server builds the other
# templates of TEMPLATES in the background (--build-templates), so that a
# fresh machine runs its first sandbox as soon as base is built.
run: deps build
	$(BIN)/lizard template build base --if-missing --template-dir $(TEMPLATE_DIR) --runsc $(RUNSC)
	exec $(BIN)/lizard serve --template-dir $(TEMPLATE_DIR) --runsc $(RUNSC) --build-templates "$(filter-out base,$(TEMPLATES))" $(SERVE_FLAGS)

test: deps build templates
	$(TEST_ENV) scripts/test.sh

# `make cluster`: PostgreSQL and three nodes, each in a network namespace of
# its own, in the foreground until Ctrl-C (docs/CLUSTER.md);
# `make cluster-down` stops one from another shell.
cluster: deps build templates
	LIZARD_BIN=$(CURDIR)/$(BIN)/lizard TEMPLATE_DIR=$(TEMPLATE_DIR) RUNSC=$(RUNSC) VERSITYGW=$(VERSITYGW) scripts/cluster.sh up

cluster-down:
	scripts/cluster.sh down

bench: build templates
	$(TEST_ENV) $(GO) run ./bench

# `make bench-cluster`: only the cluster section, on a three-node cluster of
# its own (scripts/cluster.sh with private names, addresses and ports;
# bench/cluster.go). The bench tears it down; the trap is for a bench that
# was killed.
# The same as clusterEnv in bench/cluster.go (no comment on the line: make
# would keep the space before it in the value).
BENCH_CLUSTER_DIR := /var/tmp/lizard-bench-cluster
bench-cluster: build templates
	trap '[ ! -f $(BENCH_CLUSTER_DIR)/cluster.env ] || LIZARD_CLUSTER_DIR=$(BENCH_CLUSTER_DIR) scripts/cluster.sh down' EXIT; \
	$(TEST_ENV) $(GO) run ./bench -only cluster $(BENCH_FLAGS)

$(NFPM):
	GOBIN=$(dir $(NFPM)) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)

package: build $(NFPM)
	mkdir -p $(DIST)
	LIZARD_VERSION=$(VERSION) LIZARD_ARCH=$(DEB_ARCH) $(NFPM) package --config deploy/nfpm.yaml --packager deb --target $(DIST)/

# `make image`: the node image of the Helm chart (deploy/Dockerfile,
# docs/KUBERNETES.md), with the template cache as its `templates` build
# context. Needs Docker with buildx; IMAGE names it (REGISTRY/lizard:TAG).
IMAGE ?= lizard:dev
image: templates
	docker buildx build -f deploy/Dockerfile --build-context templates=$(TEMPLATE_DIR) -t $(IMAGE) .

$(PROTO_TOOLS)/protoc-gen-connect-go:
	command -v protoc >/dev/null || apt-get install -y protobuf-compiler
	GOBIN=$(PROTO_TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(PROTO_TOOLS) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_VERSION)

proto: $(PROTO_TOOLS)/protoc-gen-connect-go
	cd internal/envd && PATH=$(PROTO_TOOLS):$$PATH protoc -I . \
	  --go_out=. --go_opt=paths=source_relative \
	  --connect-go_out=. --connect-go_opt=paths=source_relative \
	  process/process.proto filesystem/filesystem.proto

clean:
	rm -rf $(BIN) $(DIST)

# The dashboard's vendored front-end files (xterm.js and its fit addon) are
# committed, so `build` needs no npm; this refreshes them from the versions
# pinned in internal/dashboard/vendor-src/package-lock.json.
DASH := internal/dashboard
dashboard-vendor:
	cd $(DASH)/vendor-src && npm ci --no-audit --no-fund
	cp $(DASH)/vendor-src/node_modules/@xterm/xterm/lib/xterm.js $(DASH)/vendor-src/node_modules/@xterm/xterm/css/xterm.css \
		$(DASH)/vendor-src/node_modules/@xterm/addon-fit/lib/addon-fit.js $(DASH)/static/vendor/
	cp $(DASH)/vendor-src/node_modules/@xterm/xterm/LICENSE $(DASH)/static/vendor/LICENSE.xterm
	sed -i '/^\/\/# sourceMappingURL=/d' $(DASH)/static/vendor/*.js
