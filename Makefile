# Skyhive. `make demo` runs the main job, `make test` runs the checks and tests.
GO      ?= go
BIN     := bin/skyhive
GOBIN   := $(shell $(GO) env GOPATH)/bin
FUZZTIME ?= 3s

.PHONY: setup build demo test lint unit pytest fuzz bench slurm clean

setup:
	./scripts/setup.sh

build:
	$(GO) build -o $(BIN) ./cmd/skyhive

demo: setup build
	./$(BIN) demo

# The test command: formatting, vet, staticcheck, unit tests, the Python
# package's tests, then each fuzz target for a few seconds.
test: setup lint unit pytest fuzz

lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod is not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...

unit:
	$(GO) test -count=1 -timeout 40m ./...

# The Python package's tests, with Debian's interpreter and PyTorch
# (python3-torch), against the binary built here.
pytest: build
	SKYHIVE_BIN=$(CURDIR)/$(BIN) /usr/bin/python3 -m pytest -q python/tests

fuzz:
	./scripts/fuzz.sh $(FUZZTIME)

bench: build
	./$(BIN) bench all

# A one-host Slurm cluster runs every example in examples/slurm to
# completion (root only; skipped otherwise). See docs/slurm.md.
slurm:
	./scripts/slurm-local.sh

clean:
	rm -rf bin results
