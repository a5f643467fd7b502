# The doorway. `make test` is the README's test command (it finds or starts a Redis);
# `make lint` is what CI runs before it (.ci/run); `make explore` runs the model checkers
# at depth; `make redis` starts the Redis the tests need; `make demo` runs the whole
# pipeline in one process.

SHELL := bash

# golangci-lint is built from source through the Go module proxy, pinned, once per
# machine (a few minutes on a busy two-core machine; instant afterwards).
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(shell go env GOPATH)/tools/golangci-lint@$(GOLANGCI_LINT_VERSION)/golangci-lint

.PHONY: test lint fmt redis demo explore

# test runs the suite on REDIS_URL's server, else 127.0.0.1:6379, else a private
# redis-server it starts and stops (scripts/test). ARGS: other packages or flags.
test:
	bash scripts/test $(ARGS)

# explore runs every model checker on EXPLORE_SEEDS seeds (default 200) that the suite
# never runs, from EXPLORE_SEED (default: a base that changes daily) (scripts/explore).
explore:
	bash scripts/explore $(ARGS)

lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

# fmt rewrites what lint's gofmt check would report.
fmt: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) fmt ./...

$(GOLANGCI_LINT):
	GOBIN=$(dir $(GOLANGCI_LINT)) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

# redis starts a throwaway redis-server on 127.0.0.1:6379 (no persistence) unless
# something already answers there.
redis:
	@if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then \
	  echo "redis: 127.0.0.1:6379 already answers"; \
	else \
	  command -v redis-server >/dev/null || { echo "redis: install redis-server (apt-get install -y redis-server)" >&2; exit 1; }; \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no; \
	  for _ in $$(seq 1 50); do (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break; sleep 0.1; done; \
	  (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null || { echo "redis: redis-server did not start" >&2; exit 1; }; \
	  echo "redis: started on 127.0.0.1:6379"; \
	fi

demo:
	go run ./cmd/ymirflow demo
