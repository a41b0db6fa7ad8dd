#!/usr/bin/env bash
# Runs every fuzz target in the module for a short time each (default 3s).
set -euo pipefail
t="${1:-3s}"
n=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "fuzz: $pkg $target ($t)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "$pkg" >/tmp/skyhive-fuzz.log 2>&1 || { cat /tmp/skyhive-fuzz.log; exit 1; }
    n=$((n+1))
  done
done
echo "fuzz: $n targets passed"
