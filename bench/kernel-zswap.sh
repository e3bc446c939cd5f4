# Sourced by the side-by-side benchmarks (not run on its own): the kernel's
# side of a comparison. With NAME set to the benchmark's name, it makes a
# work directory ($WORK), turns on zswap (lzo-rle) with a 4 GiB swap file in
# it, and makes a cgroup v1 memory cgroup ($CG); `kernel LIMIT CMD...` runs
# CMD in that cgroup under LIMIT. On exit (also on error or ^C) everything
# goes back as it was: zswap's enabled flag and compressor, swapoff, the
# work directory and the cgroup removed. Needs root and cgroup v1.
CG=/sys/fs/cgroup/memory/uswap-$NAME
ZSWAP=/sys/module/zswap/parameters
WORK=$(mktemp -d "/var/tmp/uswap-$NAME.XXXXXX")
SWAPFILE="$WORK/swapfile"
OLD_ENABLED=$(cat $ZSWAP/enabled)
OLD_COMPRESSOR=$(cat $ZSWAP/compressor)

restore() {
	[ -d "$CG" ] && rmdir "$CG" 2>/dev/null || true
	swapoff "$SWAPFILE" 2>/dev/null || true
	echo "$OLD_COMPRESSOR" > $ZSWAP/compressor
	echo "$OLD_ENABLED" > $ZSWAP/enabled
	rm -rf "$WORK"
	echo "restored: zswap enabled=$(cat $ZSWAP/enabled) compressor=$(cat $ZSWAP/compressor), swap: $(tail -n +2 /proc/swaps | wc -l) device(s), cgroup removed" >&2
}
trap restore EXIT INT TERM

fallocate -l 4G "$SWAPFILE"
chmod 600 "$SWAPFILE"
mkswap "$SWAPFILE" > /dev/null
swapon "$SWAPFILE"
echo lzo-rle > $ZSWAP/compressor
echo Y > $ZSWAP/enabled
mkdir -p "$CG"

kernel() { # LIMIT CMD...
	echo "$1" > "$CG/memory.limit_in_bytes"
	shift
	sh -c 'echo $$ > '"$CG"'/cgroup.procs && exec "$@"' sh "$@"
}
