# Terrace. The two commands: `make demo` and `make test`. See README.md.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

LOCALBIN := $(CURDIR)/bin
CODEGEN := cd hack/tools/codegen && go build -o $(LOCALBIN)
CONTROLLER_GEN := $(LOCALBIN)/controller-gen
TOOLS_ENV = $(shell hack/tools/build.sh --env)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/terrace-dev/terrace/internal/version.Version=$(VERSION) \
           -X github.com/terrace-dev/terrace/internal/version.Commit=$(COMMIT)

.PHONY: all build deps deps-demo test test-e2e chaos console-screenshots fleet fuzz tools generate verify fmt vet demo codegen-tools clean image push

all: build

# Static (CGO off), as in the image: `terrace dev` builds the dev cluster's
# image from these binaries.
build: ## Build the terrace and terrace-runner binaries into bin/.
	CGO_ENABLED=0 go build -ldflags '$(LDFLAGS)' -o $(LOCALBIN)/terrace ./cmd/terrace
	CGO_ENABLED=0 go build -ldflags '$(LDFLAGS)' -o $(LOCALBIN)/terrace-runner ./cmd/terrace-runner

# The image: one OCI index of linux/amd64 and linux/arm64, built without a
# container engine (hack/image, internal/image). One commit gives one digest:
# the binaries are built with -trimpath and the commit's version, and every
# timestamp in the image is the commit's time.
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_SOURCE ?= https://github.com/terrace-dev/terrace
IMAGE_CREATED ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_LAYOUT := $(LOCALBIN)/image

image: ## Build the terrace image (static terrace, terrace-runner and tofu per platform) as an OCI layout in bin/image; prints its digest.
	@args=""; for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=$(LOCALBIN)/$${os}_$${arch}; \
	  echo "terrace for $$p" >&2; \
	  for cmd in terrace terrace-runner; do \
	    CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch nice go build -trimpath -buildvcs=false -ldflags '$(LDFLAGS) -s -w' -o $$out/$$cmd ./cmd/$$cmd || exit 1; \
	  done; \
	  tofu=$$(hack/tools/build.sh --tofu-for $$p); \
	  args="$$args --platform $$p=$$out/terrace,$$tofu,$$out/terrace-runner"; \
	done; \
	go run ./hack/image build --out $(IMAGE_LAYOUT) --created $(IMAGE_CREATED) \
	  --source $(IMAGE_SOURCE) --revision $(IMAGE_REVISION) --version $(VERSION) $$args

push: ## Push bin/image to IMAGE=registry/terrace:tag with your Docker config's credentials (no Docker needed).
	@test -n "$(IMAGE)" || { echo 'name the image: make push IMAGE=registry.example.com/terrace:$(VERSION)'; exit 1; }
	@test -f $(IMAGE_LAYOUT)/index.json || { echo 'no image in $(IMAGE_LAYOUT): run make image first'; exit 1; }
	go run ./hack/image push --layout $(IMAGE_LAYOUT) $(IMAGE)

tools: ## Build the control plane, the dev node (kubelet, kube-proxy, containerd, CNI, CoreDNS), tofu and Flux's source-controller into the cache (~30 min cold).
	hack/tools/build.sh

codegen-tools:
	@mkdir -p $(LOCALBIN)
	$(CODEGEN) sigs.k8s.io/controller-tools/cmd/controller-gen
	$(CODEGEN) google.golang.org/protobuf/cmd/protoc-gen-go
	$(CODEGEN) google.golang.org/grpc/cmd/protoc-gen-go-grpc
	$(CODEGEN) connectrpc.com/connect/cmd/protoc-gen-connect-go
	$(CODEGEN) ./protodeps
	$(CODEGEN) ./protodoc

generate: codegen-tools ## Regenerate deepcopy code, CRDs, RBAC and protobuf.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	cp config/crd/bases/*.yaml charts/terrace/crds/
	@if [ -d internal/controller ]; then $(CONTROLLER_GEN) rbac:roleName=terrace-controller paths=./internal/... output:rbac:artifacts:config=config/rbac; fi
	cp config/rbac/role.yaml charts/terrace/files/
	@# The runner speaks grpc-go; the Installations API (proto/terrace/api) is
	@# served with connect-go. google/api/annotations.proto comes as descriptors
	@# from the Go module that implements it (hack/tools/codegen/protodeps).
	$(LOCALBIN)/protodeps $(LOCALBIN)/googleapis.binpb
	@for dir in proto/terrace/*/v1; do \
	  compgen -G "$$dir/*.proto" >/dev/null || continue; \
	  case $$dir in \
	    proto/terrace/api/*) rpc="--connect-go_out=. --connect-go_opt=module=github.com/terrace-dev/terrace" ;; \
	    *) rpc="--go-grpc_out=. --go-grpc_opt=module=github.com/terrace-dev/terrace" ;; \
	  esac; \
	  PATH=$(LOCALBIN):$$PATH protoc -I proto --descriptor_set_in=$(LOCALBIN)/googleapis.binpb \
	    --go_out=. --go_opt=module=github.com/terrace-dev/terrace $$rpc $$dir/*.proto; \
	done
	protoc -I proto --descriptor_set_in=$(LOCALBIN)/googleapis.binpb --include_source_info \
	  --descriptor_set_out=$(LOCALBIN)/api.binpb proto/terrace/api/v1/*.proto
	$(LOCALBIN)/protodoc $(LOCALBIN)/api.binpb terrace.api.v1 > docs/api-reference.md

verify: generate fmt vet ## Fail when generated code, formatting or go.mod/go.sum are stale.
	@go mod tidy -diff || { echo 'go.mod/go.sum are not tidy: run go mod tidy and commit'; exit 1; }
	@git diff --exit-code -- api config proto internal cmd charts docs/api-reference.md || { echo 'generated files or formatting are stale: run make generate and commit'; exit 1; }
	@test -z "$$(git status --porcelain -- api config proto)" || { git status --porcelain -- api config proto; echo 'untracked generated files: commit them'; exit 1; }

fmt:
	gofmt -l -w $$(git ls-files '*.go' | grep -v '^hack/')

vet:
	go vet ./...

deps: ## Install the Debian packages the tests need (protoc, PostgreSQL) unless present.
	@hack/phase.sh deps bash hack/install-deps.sh test

deps-demo:
	@bash hack/install-deps.sh demo

# Each step is a phase (hack/phase.sh): .ci/run prints their times at its end.
test: deps ## The whole suite: verify, unit, envtest and end-to-end tests, with the tools from `make tools`.
	hack/phase.sh tools hack/tools/build.sh >/dev/null
	hack/phase.sh verify $(MAKE) verify
	hack/phase.sh go-test env $$(hack/tools/build.sh --env) hack/go-test.sh -count=1 -timeout 45m

test-e2e: deps ## The end-to-end tier alone: dev cluster, runner pods, real tofu.
	hack/tools/build.sh >/dev/null
	env $$(hack/tools/build.sh --env) go test ./test/e2e/ -count=1 -timeout 40m

# The long fault run of issue 16 (test/chaos): kills, restarts, rotations
# and full disks while Stacks run, then a results table (docs/reliability.md).
# Its smoke version, TestChaosSmoke, runs in `make test`. CHAOS_SCALE
# multiplies the issue's counts (0.25 for a quarter of the injections).
CHAOS_SCALE ?= 1
chaos: deps ## Inject every fault as often as issue 16 asks and print the results table (tens of minutes).
	hack/tools/build.sh >/dev/null
	TERRACE_CHAOS_SCALE=$(CHAOS_SCALE) env $$(hack/tools/build.sh --env) \
	  nice go test -tags chaos ./test/chaos/ -run '^TestChaosLong$$' -count=1 -timeout 4h -v

# The console's screenshots in docs/images (docs/console.md), taken by the
# browser test; make test writes them to a temporary directory instead.
console-screenshots: deps ## Retake docs/images/console-*.png with the browser test.
	hack/tools/build.sh >/dev/null
	TERRACE_CONSOLE_SCREENSHOTS=docs env $$(hack/tools/build.sh --env) \
	  go test ./test/e2e/ -run '^TestConsoleInABrowser$$' -count=1 -timeout 20m

# FLEET_STACKS Stacks to Ready against as many direct tofu applies at the
# same concurrency; prints time, ratio, CPU by part, API calls, tofu
# processes, etcd and Secret bytes per Stack and the controller's peak
# memory, and plots Ready over time into
# docs/images/fleet-<FLEET_STACKS>-stacks-ready.png. The controller runs as
# the chart's Deployment (FLEET_CONTROLLER=process or inprocess to run it
# otherwise).
FLEET_STACKS ?= 1000
FLEET_WARM ?= 4
FLEET_CONCURRENCY ?= 4
FLEET_CONTROLLER ?= deployment
fleet: deps ## Take FLEET_STACKS (1000) Stacks to Ready on the dev cluster against direct tofu, FLEET_WARM (4) warm runners, FLEET_CONCURRENCY (4) at once, the controller as the chart's Deployment; prints the accounting (not in make test).
	hack/tools/build.sh >/dev/null
	TERRACE_BENCH_STACKS=$(FLEET_STACKS) TERRACE_BENCH_WARM=$(FLEET_WARM) TERRACE_BENCH_CONCURRENCY=$(FLEET_CONCURRENCY) \
	  TERRACE_BENCH_CONTROLLER=$(FLEET_CONTROLLER) TERRACE_BENCH_PLOT_DIR=$(CURDIR)/docs/images env $$(hack/tools/build.sh --env) \
	  nice go test ./test/e2e/ -run '^$$' -bench '^BenchmarkStackToReady$$' -benchtime 1x -timeout 5h -v

# Every fuzz target, as package:Name. Their seed corpora (testdata/fuzz/)
# run as ordinary tests with `go test`; `make fuzz` also explores for
# FUZZTIME each. The state server's package starts PostgreSQL in TestMain
# for its other tests; its fuzz target uses an in-memory store, so a URL
# that is never dialled stands in.
FUZZTIME ?= 30s
FUZZ_TARGETS := \
	./internal/artifact:FuzzExtract \
	./internal/artifact:FuzzExtractEntries \
	./internal/controller/program:FuzzValidateFiles \
	./internal/nesting:FuzzCheckHCL \
	./internal/nesting:FuzzCheckJSON \
	./internal/state:FuzzCodecRoundTrip \
	./internal/state:FuzzCodecOpen \
	./internal/state/httpbackend:FuzzStateServer

fuzz: ## Run each fuzz target for FUZZTIME (default 30s); a failure leaves its input in testdata/fuzz.
	@failed=""; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "== $$name in $$pkg for $(FUZZTIME)"; \
	  TERRACE_TEST_POSTGRES_URL=$${TERRACE_TEST_POSTGRES_URL:-postgres://unused.invalid/fuzz} \
	    go test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz targets failed:$$failed (inputs kept under testdata/fuzz/)"; exit 1; fi

demo: deps-demo ## A local cluster, the operator, a real Stack planned and applied, results printed.
	@# Quiet unless something is built: the demo's output is its progress and results.
	@hack/tools/build.sh 2>&1 >/dev/null | { grep -v ': cached' || true; }
	@$(MAKE) --no-print-directory -s build
	@$(LOCALBIN)/terrace dev --demo

clean:
	rm -rf $(LOCALBIN)
