#!/bin/sh
# A/B benchmark of two builds in one run: scripts/ab.sh REV [SUITE...]
#
# Builds skyhive at git revision REV (A) and from the working tree (B),
# then runs each suite (default: rpc moe averaging dht) with --quick,
# alternating A B A B A B, and prints, per case and metric, the median of
# A's values, of B's and B/A. JSON lines land in $AB_OUT (default a new
# temporary directory). Run it on an otherwise idle machine.
set -eu
rev=${1:?usage: scripts/ab.sh REV [SUITE...]}
shift
suites=${*:-rpc moe averaging dht}
rounds=${AB_ROUNDS:-3}
out=${AB_OUT:-$(mktemp -d)}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/a" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/a" "$rev" >/dev/null
(cd "$work/a" && go build -o "$work/skyhive-a" ./cmd/skyhive)
(cd "$root" && go build -o "$work/skyhive-b" ./cmd/skyhive)
echo "A: $(git -C "$root" rev-parse --short "$rev"), B: working tree; $(nproc) CPUs; results in $out" >&2
for suite in $suites; do
	for r in $(seq "$rounds"); do
		for v in a b; do
			echo "$suite round $r: $v" >&2
			"$work/skyhive-$v" bench "$suite" --quick --json >>"$out/$suite-$v.jsonl" 2>>"$out/log"
		done
	done
done
python3 - "$out" $suites <<'PY'
import json, statistics, sys
out, suites = sys.argv[1], sys.argv[2:]
print("| suite | case | metric | A | B | B/A |")
print("|---|---|---|---|---|---|")
for s in suites:
    vals = {}
    for v in "ab":
        for line in open(f"{out}/{s}-{v}.jsonl"):
            r = json.loads(line)
            key = (r.get("case", ""), r.get("metric", ""), r.get("unit", ""))
            vals.setdefault(key, {"a": [], "b": []})[v].append(r["value"])
    for (case, metric, unit), d in sorted(vals.items()):
        if not d["a"] or not d["b"]:
            continue
        a, b = statistics.median(d["a"]), statistics.median(d["b"])
        ratio = f"{b / a:.3f}" if a else "-"
        print(f"| {s} | {case} | {metric} ({unit}) | {a:.4g} | {b:.4g} | {ratio} |")
PY
