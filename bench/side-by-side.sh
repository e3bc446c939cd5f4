#!/bin/sh
# The same unmodified programs (bench/touch.c) under the kernel's zswap and
# under `uswap run`, back to back, on this machine (DESIGN.md section 9).
#
#   bench/side-by-side.sh [RUNS]
#
# Needs root and cgroup v1. For the kernel runs it turns on zswap (lzo-rle)
# with a 4 GiB swap file and puts the program in a memory cgroup with the
# limit; on exit (also on error or ^C) it puts everything back as it was:
# zswap's enabled flag and compressor, swapoff, the file and the cgroup
# removed (bench/kernel-zswap.sh). Workloads, each RUNS times (default 3)
# per side:
#   faults: 2 processes x 256 MiB of corpus pages touched at random under
#           32 MiB (every fault needs an eviction), 4 KiB pages (uswap also
#           with 64 KiB folios)
#   faults, no pressure: the same memory filled under 32 MiB, then the
#           limit lifted to 4 GiB (the cgroup's limit; `uswap limit`) and
#           4000 pages touched at random: swap-ins with no eviction beside
#           them, the kernel's usual swap-in test
#   floor:  the bare userfaultfd round trip (bench/probes/uffd-roundtrip.c),
#           by where its handler runs and whether it sleeps
#   usemem: 2 processes x 1536 MiB written then checked, under 1 GiB; and
#           `uswap usemem` itself (the runtime in the process), with 2
#           threads sharing one runtime and with 2 processes
#
# HALT_POLL_NS=N (in a VM guest with the haltpoll cpuidle driver) has idle
# CPUs poll for N ns before they halt, for the whole run, and puts the old
# value back at the end. Where they halt at once (0), a thread woken on an
# idle CPU waits for the host to run that vCPU again: the round trip's
# "other CPU" line shows what that costs. Both sides run under the same
# setting; 200000 is KVM's default.
set -eu
RUNS=${1:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
USWAP="$ROOT/target/release/uswap"
NAME=side-by-side
. "$ROOT/bench/kernel-zswap.sh"

HALT_POLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ -n "${HALT_POLL_NS:-}" ]; then
	[ -w "$HALT_POLL" ] || { echo "HALT_POLL_NS: no $HALT_POLL here" >&2; exit 2; }
	OLD_HALT_POLL=$(cat "$HALT_POLL")
	trap 'echo "$OLD_HALT_POLL" > "$HALT_POLL"; restore' EXIT INT TERM
	echo "$HALT_POLL_NS" > "$HALT_POLL"
fi

[ -x "$USWAP" ] || (cd "$ROOT" && cargo build --release)
cc -O2 -o "$WORK/touch" "$ROOT/bench/touch.c"
cc -O2 -pthread -o "$WORK/roundtrip" "$ROOT/bench/probes/uffd-roundtrip.c"
PAGES=$(ls "$ROOT"/corpus/*.pages | sort)

for run in $(seq "$RUNS"); do
	echo "== run $run"
	# The floor of any fault served from user space on this machine.
	"$WORK/roundtrip" | sed 's/^/uffd round trip, /'
	printf 'kernel zswap 4K      '; kernel 32M "$WORK/touch" faults 256 2 20000 $PAGES
	printf 'uswap run 4K folios  '; "$USWAP" run --memory-high 32M --folio-size 4k --compressor lzo-rle -- "$WORK/touch" faults 256 2 20000 $PAGES
	printf 'uswap run 64K folios '; "$USWAP" run --memory-high 32M --folio-size 64k --compressor lzo-rle -- "$WORK/touch" faults 256 2 20000 $PAGES
	# touch runs TOUCH_AFTER_FILL with `sh -c`, whose parent ($PPID) is touch.
	printf 'kernel zswap 4K, no pressure      '
	TOUCH_AFTER_FILL="echo 4G > $CG/memory.limit_in_bytes" kernel 32M "$WORK/touch" faults 256 2 4000 $PAGES
	for folio in 4k 64k; do
		printf 'uswap run %-3s folios, no pressure ' $folio
		TOUCH_AFTER_FILL="$USWAP limit 4G \$PPID > /dev/null" "$USWAP" run --memory-high 32M --folio-size $folio --compressor lzo-rle -- "$WORK/touch" faults 256 2 4000 $PAGES
	done
	printf 'kernel zswap         '; kernel 1G "$WORK/touch" usemem 1536 2
	printf 'uswap run            '; "$USWAP" run --memory-high 1G --compressor lzo-rle -- "$WORK/touch" usemem 1536 2
	for mode in threads processes; do
		printf 'uswap usemem %-9s ' $mode
		flag=; [ $mode = processes ] && flag=--processes
		"$USWAP" usemem 1536M -n 2 $flag --memory-high 1G --compressor lzo-rle |
			awk '/Total throughput/ { printf "%.0f MB/s ", $NF * 1024 / 1e6 } /elapsed time/ { printf "elapsed %s s\n", $NF }'
	done
done
