#!/bin/sh
# Unmodified build and text jobs under the kernel's zswap and under `uswap
# run`, back to back, at the same limits (DESIGN.md section 9), with their
# output checked against a run without any limit.
#
#   bench/real-programs.sh [LIMIT...]     (default: 64M 128M)
#
# Needs root and cgroup v1; zswap, a swap file and a memory cgroup are set
# up for the kernel's runs and put back at the end (bench/kernel-zswap.sh).
# The jobs:
#   gcc: gcc -O2 -c on a generated C file of 1,500 functions (cc1 peaks
#        at about 330 MiB resident); the object file must be byte for byte
#        the same;
#   sort: a pipeline (awk | sort -S 256M --parallel=2 | md5sum) over 1.5
#        million pseudo-random lines (sort peaks at about 120 MiB); the
#        digest must be the same.
# Prints, per job and limit, the seconds each side took and whether its
# output was right. The kernel's cgroup v1 limit is a hard one: a job it
# cannot keep under the limit is killed (printed as "killed"), where
# --memory-high throttles.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
USWAP="$ROOT/target/release/uswap"
LIMITS=${*:-64M 128M}
NAME=real-programs
. "$ROOT/bench/kernel-zswap.sh"

[ -x "$USWAP" ] || (cd "$ROOT" && cargo build --release)
python3 - > "$WORK/big.c" <<'PY'
import random
random.seed(3)
print('#include <stdint.h>')
for f in range(1500):
    print('uint64_t f%d(uint64_t x) {' % f)
    print('  uint64_t a = x * %d, b = x ^ %d;' % (random.randrange(1, 10**6), random.randrange(10**6)))
    for s in range(30):
        print('  a = (a << %d) ^ (b + %d); b = b * %d + (a >> %d);' % (
            random.randrange(1, 60), random.randrange(10**6), random.randrange(1, 999), random.randrange(1, 60)))
    print('  return a ^ b;\n}')
PY
# Each job is a script whose one argument is where its output goes.
echo 'exec gcc -O2 -c "$(dirname "$0")/big.c" -o "$1"' > "$WORK/gcc.sh"
cat > "$WORK/sort.sh" <<'SH'
awk 'BEGIN { srand(7); for (i = 0; i < 1500000; i++) printf "%09d %s\n", int(rand() * 1e9), substr("abcdefghijklmnopqrstuvwxyz", int(rand() * 20) + 1, 7) }' |
	sort -S 256M --parallel=2 | md5sum > "$1"
SH

# timed LABEL REF OUT CMD...: runs CMD, and prints its seconds and whether
# OUT came out the same as REF (no REF: the reference run itself); a run
# the cgroup's OOM killer ended is "killed".
timed() {
	label=$1 ref=$2 out=$3
	shift 3
	rm -f "$out"
	kills=$(awk '/^oom_kill / { print $2 }' "$CG/memory.oom_control")
	start=$(date +%s.%N)
	if "$@" 2> "$WORK/err"; then ok=yes; else ok=no; fi
	end=$(date +%s.%N)
	if [ -z "$ref" ]; then
		right=reference
	elif [ "$(awk '/^oom_kill / { print $2 }' "$CG/memory.oom_control")" != "$kills" ]; then
		right=killed
	elif [ $ok = yes ] && cmp -s "$ref" "$out"; then
		right=right
	else
		right=WRONG
	fi
	awk -v l="$label" -v a="$start" -v b="$end" -v r="$right" 'BEGIN { printf "  %-22s %7.1f s  %s\n", l, b - a, r }'
}
for name in gcc sort; do
	echo "$name"
	timed alone "" "$WORK/$name.ref" sh "$WORK/$name.sh" "$WORK/$name.ref"
	for limit in $LIMITS; do
		timed "kernel zswap, $limit" "$WORK/$name.ref" "$WORK/$name.out" \
			kernel "$limit" sh "$WORK/$name.sh" "$WORK/$name.out"
		timed "uswap run, $limit" "$WORK/$name.ref" "$WORK/$name.out" \
			"$USWAP" run --memory-high "$limit" --compressor lzo-rle -- sh "$WORK/$name.sh" "$WORK/$name.out"
	done
done
