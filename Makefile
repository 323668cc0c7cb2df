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

.PHONY: all build test test-e2e fuzz tools generate verify fmt vet demo codegen-tools clean

all: build

build: ## Build the terrace binary into bin/.
	go build -ldflags '$(LDFLAGS)' -o $(LOCALBIN)/terrace ./cmd/terrace

tools: ## Build etcd, kube-apiserver, kube-controller-manager, kubectl and tofu into the cache (~25 min cold).
	hack/tools/build.sh

codegen-tools:
	@mkdir -p $(LOCALBIN)
	$(CODEGEN) sigs.k8s.io/controller-tools/cmd/controller-gen
	$(CODEGEN) google.golang.org/protobuf/cmd/protoc-gen-go
	$(CODEGEN) google.golang.org/grpc/cmd/protoc-gen-go-grpc

generate: codegen-tools ## Regenerate deepcopy code, CRDs, RBAC and protobuf.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	@if [ -d internal/controller ]; then $(CONTROLLER_GEN) rbac:roleName=terrace-controller paths=./internal/... output:rbac:artifacts:config=config/rbac; fi
	@if compgen -G 'proto/terrace/*/v1/*.proto' >/dev/null; then \
	  PATH=$(LOCALBIN):$$PATH protoc -I proto \
	    --go_out=. --go_opt=module=github.com/terrace-dev/terrace \
	    --go-grpc_out=. --go-grpc_opt=module=github.com/terrace-dev/terrace \
	    proto/terrace/*/v1/*.proto; \
	fi

verify: generate fmt vet ## Fail when generated code or formatting is stale.
	@git diff --exit-code -- api config proto internal cmd || { echo 'generated files or formatting are stale: run make generate and commit'; exit 1; }
	@test -z "$$(git status --porcelain -- api config proto)" || { git status --porcelain -- api config proto; echo 'untracked generated files: commit them'; exit 1; }

fmt:
	gofmt -l -w $$(git ls-files '*.go' | grep -v '^hack/')

vet:
	go vet ./...

test: ## The whole suite: verify, unit, envtest and end-to-end tests, with the tools from `make tools`.
	hack/tools/build.sh >/dev/null
	$(MAKE) verify
	env $$(hack/tools/build.sh --env) go test ./... -count=1 -timeout 45m

test-e2e: ## The end-to-end tier alone: dev cluster, runner pods, real tofu.
	hack/tools/build.sh >/dev/null
	env $$(hack/tools/build.sh --env) go test ./test/e2e/ -count=1 -timeout 40m

# Every fuzz target, as package:Name. Their seed corpora (testdata/fuzz/)
# run as ordinary tests with `go test`; `make fuzz` also explores for
# FUZZTIME each. The state server's package starts PostgreSQL in TestMain
# for its other tests; its fuzz target uses an in-memory store, so a URL
# that is never dialled stands in.
FUZZTIME ?= 30s
FUZZ_TARGETS := \
	./internal/artifact:FuzzExtract \
	./internal/artifact:FuzzExtractEntries \
	./internal/state:FuzzCodecRoundTrip \
	./internal/state:FuzzCodecOpen \
	./internal/state/httpbackend:FuzzStateServer

fuzz: ## Run each fuzz target for FUZZTIME (default 30s); a failure leaves its input in testdata/fuzz.
	@for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "== $$name in $$pkg for $(FUZZTIME)"; \
	  TERRACE_TEST_POSTGRES_URL=$${TERRACE_TEST_POSTGRES_URL:-postgres://unused.invalid/fuzz} \
	    go test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME); \
	done

demo: tools build ## A local cluster, the operator, a real Stack planned and applied, results printed.
	$(LOCALBIN)/terrace dev --demo

clean:
	rm -rf $(LOCALBIN)
