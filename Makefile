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

.PHONY: all build deps deps-demo test test-e2e tools generate verify fmt vet demo codegen-tools clean

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

deps: ## Install the Debian packages the tests need (protoc, PostgreSQL) unless present.
	@bash hack/install-deps.sh test

deps-demo:
	@bash hack/install-deps.sh demo

test: deps ## The whole suite: verify, unit, envtest and end-to-end tests, with the tools from `make tools`.
	hack/tools/build.sh >/dev/null
	$(MAKE) verify
	env $$(hack/tools/build.sh --env) go test ./... -count=1 -timeout 45m

test-e2e: deps ## The end-to-end tier alone: dev cluster, runner pods, real tofu.
	hack/tools/build.sh >/dev/null
	env $$(hack/tools/build.sh --env) go test ./test/e2e/ -count=1 -timeout 40m

demo: deps-demo ## A local cluster, the operator, a real Stack planned and applied, results printed.
	@# Quiet unless something is built: the demo's output is its progress and results.
	@hack/tools/build.sh 2>&1 >/dev/null | { grep -v ': cached' || true; }
	@$(MAKE) --no-print-directory -s build
	@$(LOCALBIN)/terrace dev --demo

clean:
	rm -rf $(LOCALBIN)
