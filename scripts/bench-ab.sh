#!/usr/bin/env bash
# bench-ab.sh OLD [NEW]: the router benchmarks (bare Watermill vs ours) at two commits,
# in one run: both test binaries are built first, then run alternately N times (default
# 10), so that the machine's load falls on both alike. Prints benchstat's comparison and
# each commit's per-round ratio bare/ours. NEW defaults to the working tree.
#
#   scripts/bench-ab.sh 432d69b            # this round of issue 18, before vs now
#   N=20 scripts/bench-ab.sh HEAD~3 HEAD
set -euo pipefail
old=${1:?usage: bench-ab.sh OLD [NEW]}; new=${2:-}; n=${N:-10}
root=$(git rev-parse --show-toplevel)
out=$(mktemp -d); trap 'for c in old new; do git -C "$root" worktree remove --force "$out/src-$c" 2>/dev/null || true; done; rm -rf "$out"' EXIT
for c in old new; do
  rev=$old; [ "$c" = new ] && rev=$new
  if [ -z "$rev" ]; then src=$root; else
    git -C "$root" worktree add --detach "$out/src-$c" "$rev" >/dev/null; src=$out/src-$c; fi
  echo "building $c (${rev:-working tree})" >&2
  (cd "$src" && go test -c -o "$out/$c.test" ./pipeline/)
  echo "$src" > "$out/$c.src"
done
for i in $(seq 1 "$n"); do
  echo "round $i/$n" >&2
  for c in old new; do
    (cd "$(cat "$out/$c.src")/pipeline" && "$out/$c.test" -test.run '^$' -test.bench 'Router(Bare|Locked)$' \
      -test.benchtime 3000x -test.count 1 -test.benchmem) | grep '^Benchmark' >> "$out/$c.txt"
  done
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$out/old.txt" "$out/new.txt"
for c in old new; do
  awk '/RouterBare/{b=$3} /RouterLocked/{print b/$3}' "$out/$c.txt" | sort -g |
    awk -v name="$c" '{r[++k]=$1} END{printf "%s: per-round ratio bare/ours median %.3f (min %.3f, max %.3f, %d rounds)\n", name, (k%2?r[(k+1)/2]:(r[k/2]+r[k/2+1])/2), r[1], r[k], k}'
done
