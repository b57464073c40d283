# airlock: `make run` sets up the host and starts airlock; `make test` runs
# every test. Both work as root on a fresh Debian 12 (bookworm) x86-64
# machine, the one host they are tested on (README.md says what setup takes
# from Debian's archive).

GO := $(shell scripts/ensure-go.sh)
# Tests that run `go` themselves find the same toolchain.
export PATH := $(dir $(GO)):$(PATH)
BIN := bin
export CGO_ENABLED := 0

.PHONY: all build setup run cluster cluster-down test unit e2e soak bench vet clean kube-start

all: build

# `airlock version` prints the revision go build records in a git checkout;
# the linker flag carries it as well, for a toolchain set to
# -buildvcs=false and for a git worktree (whose .git is a file go build
# does not look for). Outside a git checkout both are empty.
REVISION := $(shell r=$$(git rev-parse HEAD 2>/dev/null) && { [ -z "$$(git status --porcelain 2>/dev/null)" ] || r=$$r-modified; echo $$r; })
build:
	$(GO) build -trimpath -o $(BIN)/airlock-agent ./cmd/airlock-agent
	$(GO) build -trimpath -o $(BIN)/airlock-probe ./cmd/airlock-probe
	$(GO) build -trimpath -ldflags "-X github.com/airlockhq/airlock/internal/cli.revision=$(REVISION)" -o $(BIN)/airlock ./cmd/airlock

setup: build
	scripts/timed.sh setup $(BIN)/airlock setup

# Running airlock means serving its API (AIRLOCK_LISTEN to change where).
AIRLOCK_LISTEN ?= 127.0.0.1:7700
AIRLOCK_SERVE_FLAGS ?=
run: setup
	$(BIN)/airlock serve --listen $(AIRLOCK_LISTEN) $(AIRLOCK_SERVE_FLAGS)

# A whole cluster on this machine (docs/kubernetes.md): etcd,
# kube-apiserver and kube-scheduler built by tools/kube/build.sh (about 20
# minutes the first time, cached after), a PostgreSQL, two node agents and
# two API replicas, until Ctrl-C or `make cluster-down` (from another
# shell), which also removes its files. It prints AIRLOCK_URL and
# AIRLOCK_API_KEY, and writes them to $(AIRLOCK_CLUSTER_DIR)/env.
AIRLOCK_CLUSTER_DIR ?= /var/lib/airlock-cluster
cluster: setup
	@scripts/ensure-postgres.sh
	@tools/kube/build.sh >/dev/null
	$(BIN)/airlock localcluster --dir $(AIRLOCK_CLUSTER_DIR) --kube-bin $$(tools/kube/build.sh)

cluster-down: build
	$(BIN)/airlock localcluster down --dir $(AIRLOCK_CLUSTER_DIR)

# vet, build and the e2e tests compile with the same flags (-trimpath),
# so that they share one build cache: on a fresh machine the second and
# third compile of the dependencies would take minutes each.
# vet also runs staticcheck (settings: staticcheck.conf) and errcheck
# (scripts/errcheck.sh), at the versions tools/lint/go.mod pins, built from
# the Go module proxy into $(TOOLS) the first time (docs/testing.md).
TOOLS := .tools
$(TOOLS)/staticcheck $(TOOLS)/errcheck $(TOOLS)/gotestsum &: tools/lint/go.mod tools/lint/go.sum
	GOBIN=$(CURDIR)/$(TOOLS) scripts/timed.sh "vet's tools" $(GO) -C tools/lint install tool
	@touch $(TOOLS)/staticcheck $(TOOLS)/errcheck $(TOOLS)/gotestsum

vet: $(TOOLS)/staticcheck $(TOOLS)/errcheck
	scripts/timed.sh vet $(GO) vet -trimpath ./...
	scripts/timed.sh staticcheck $(TOOLS)/staticcheck ./...
	scripts/timed.sh errcheck scripts/errcheck.sh $(TOOLS)/errcheck
	@test -z "$$(gofmt -l cmd internal e2e)" || { gofmt -l cmd internal e2e; exit 1; }

# Host packages under the race detector (it needs cgo), then the end-to-end
# tests that boot real VMs.
# The VM tests of minimal images compile a musl program with musl-gcc.
# The store's tests run on SQLite and on throwaway PostgreSQL clusters.
# The cluster's packages run etcd and kube-apiserver, built once from the
# Go module proxy (tools/kube/build.sh: about 20 minutes the first time):
# they go last, so that a build started in the background (make test) has
# the other packages' time to finish.
# The code interpreter's server runs against Debian's Jupyter kernels
# (Python's, and R's from r-cran-irkernel) and runs JavaScript and
# TypeScript under node with Debian's node-typescript, the
# e2b bench scenario's script checks with node (scripts/ensure-node.sh),
# and the whole setup runs into a temporary directory (AIRLOCK_SETUP_IT).
KUBE_PKGS := ./internal/cluster/... ./internal/kubetest/...
unit:
	@command -v musl-gcc >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends musl-tools; }
	@/usr/bin/python3 -c 'import jupyter_client, ipykernel' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-jupyter-client python3-ipykernel; }
	@scripts/ensure-postgres.sh
	@scripts/ensure-node.sh >/dev/null
	@test -e /usr/share/nodejs/typescript/package.json -a -e /usr/share/jupyter/kernels/ir/kernel.json || { apt-get update -qq && apt-get install -y -qq --no-install-recommends node-typescript r-cran-irkernel; }
	scripts/timed.sh unit env CGO_ENABLED=1 AIRLOCK_SETUP_IT=1 PATH="$$(scripts/ensure-node.sh)$$PATH" $(GO) test -race -count=1 . $$($(GO) list ./internal/... ./cmd/... | grep -v -E '/internal/(cluster|kubetest)$$')
	@scripts/timed.sh "the control plane's build" tools/kube/build.sh >/dev/null
	scripts/timed.sh "unit (cluster)" env CGO_ENABLED=1 AIRLOCK_KUBE_BIN=$$(tools/kube/build.sh) $(GO) test -race -count=1 $(KUBE_PKGS)

# The e2e tests run under gotestsum (scripts/gotest.sh), which prints what
# go test prints and then the tests that took 30 s or more, slowest first,
# so that a slow test shows where it can be found; its record of every
# test stays in bin/e2e-tests.json.
# The network tests make test hosts in network namespaces with iproute2's ip.
# The cluster test (e2e/cluster_test.go) runs `airlock node` against etcd,
# kube-apiserver and kube-scheduler from tools/kube/build.sh.
# The E2B SDK tests run E2B's JavaScript SDK on a Node.js new enough for
# it (scripts/ensure-node.sh installs one when the host has none), the SDK
# installed from e2e/e2bsdk's lockfile (again only when the lockfile is
# newer than the install); the agent clients' tests (the MCP TypeScript SDK,
# the OpenAI Agents SDK) from e2e/agents' lockfile the same way.
e2e: setup $(TOOLS)/gotestsum
	@command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq iproute2; }
	@scripts/ensure-postgres.sh
	@scripts/ensure-node.sh >/dev/null
	@cd e2e/e2bsdk && { [ node_modules/.package-lock.json -nt package-lock.json ] || PATH="$$(../../scripts/ensure-node.sh)$$PATH" npm ci --no-audit --no-fund; }
	@cd e2e/agents && { [ node_modules/.package-lock.json -nt package-lock.json ] || PATH="$$(../../scripts/ensure-node.sh)$$PATH" npm ci --no-audit --no-fund; }
	@scripts/timed.sh "the control plane's build" tools/kube/build.sh >/dev/null
	AIRLOCK_BIN=$(CURDIR)/$(BIN) PATH="$$(scripts/ensure-node.sh)$$PATH" AIRLOCK_KUBE_BIN=$$(tools/kube/build.sh) scripts/timed.sh e2e \
		scripts/gotest.sh $(TOOLS)/gotestsum $(BIN)/e2e-tests.json -trimpath -count=1 -timeout 50m ./e2e/...

# The reliability suite alone (e2e/reliability_test.go), long: 500
# create/exec/delete cycles instead of 50, with the attacks from inside a
# guest and the kills of QEMU and of the server.
soak: setup
	AIRLOCK_SOAK=1 AIRLOCK_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 2h -v -run '^TestReliability' ./e2e/

# Setup first, so that the unit phase's VM tests (internal/sandbox) run on
# a fresh machine too instead of skipping for want of boot artifacts. The
# control plane's first build (about 20 minutes on 2 cores) starts in the
# background before anything else and is waited for only by the tests
# that run it. Each phase prints its time, and the whole its own.
TEST_START := $(shell date +%s)
test: kube-start vet setup unit e2e
	@echo "make test: passed in $$(( $$(date +%s) - $(TEST_START) )) s" >&2

kube-start:
	@tools/kube/build.sh --start

# The cluster_ scenarios run a local cluster on the Kubernetes binaries.
bench: setup
	@scripts/ensure-postgres.sh
	@tools/kube/build.sh >/dev/null
	$(BIN)/airlock bench --kube-bin $$(tools/kube/build.sh)

clean:
	rm -rf $(BIN) $(TOOLS)
