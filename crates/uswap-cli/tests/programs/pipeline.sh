# Unmodified programs in a pipeline, each a process of its own: awk writes
# pseudo-random lines, sort orders them in memory with two threads (its
# buffer set above what the run's limit lets stay resident), and md5sum,
# cut, uniq and a second sort sum the result up.
set -e
lines() {
	awk 'BEGIN {
		srand(7)
		for (i = 0; i < 600000; i++)
			printf "%09d %s\n", int(rand() * 1e9), substr("abcdefghijklmnopqrstuvwxyz", int(rand() * 20) + 1, 7)
	}'
}
lines | sort -S 64M --parallel=2 | md5sum
lines | sort -k2,2 -S 64M --parallel=2 | cut -d' ' -f2 | uniq -c | sort -rn | head -5
