/*
 * touch: the same memory workloads for the kernel's zswap and for
 * `uswap run`, so that both can be measured side by side on one machine
 * (bench/side-by-side.sh).
 *
 *   touch faults SIZE_MB PROCS FAULTS PAGES_FILE...
 *       PROCS processes each fill SIZE_MB of private anonymous memory with
 *       corpus pages (page i gets corpus page i*7 mod n, as `uswap bench
 *       faults` does), then touch FAULTS/PROCS pages at random that are not
 *       in memory (mincore), timing each touch. Prints the latency
 *       percentiles of all touches together and the pages brought in per
 *       second. With TOUCH_AFTER_FILL set in the environment, every process
 *       waits once it has filled its memory, until that shell command has
 *       run (`sh -c`, its parent being this program): a command that lifts
 *       the memory limit there turns the touches into swap-ins with no
 *       eviction beside them (the no-pressure mode of `uswap bench faults`,
 *       the kernel's usual swap-in test).
 *
 *   touch usemem SIZE_MB PROCS
 *       PROCS processes each write SIZE_MB (word i holds i, as usemem does),
 *       then read it all back and check it. Prints the write throughput
 *       (sum over processes), as vm-scalability's usemem does.
 *
 * Results travel through a shared mapping, which neither the kernel's
 * memory limit nor uswap (private anonymous memory only) counts.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *shared_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap shared");
		exit(1);
	}
	return p;
}

static char *private_map(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	/* Base pages, as the kernel's zswap stores them. */
	madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

static void wait_all(int procs)
{
	for (int i = 0; i < procs; i++) {
		int status;
		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "touch: a process failed (status %#x)\n", status);
			exit(1);
		}
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static char *load_pages(int files, char **names, size_t *pages)
{
	size_t total = 0;
	for (int i = 0; i < files; i++) {
		struct stat st;
		if (stat(names[i], &st) != 0) {
			perror(names[i]);
			exit(2);
		}
		total += (size_t)st.st_size / PAGE * PAGE;
	}
	char *buf = malloc(total);
	size_t at = 0;
	for (int i = 0; i < files; i++) {
		int fd = open(names[i], O_RDONLY);
		struct stat st;
		fstat(fd, &st);
		size_t want = (size_t)st.st_size / PAGE * PAGE;
		while (want > 0) {
			ssize_t n = read(fd, buf + at, want);
			if (n <= 0) {
				perror(names[i]);
				exit(1);
			}
			at += (size_t)n;
			want -= (size_t)n;
		}
		close(fd);
	}
	*pages = total / PAGE;
	return buf;
}

static int faults(size_t size, int procs, long count, int files, char **names)
{
	size_t n;
	char *corpus = load_pages(files, names, &n);
	long per = count / procs;
	uint64_t *lat = shared_map(sizeof(uint64_t) * (size_t)per * procs);
	uint64_t *took = shared_map(sizeof(uint64_t) * procs);
	/* [0]: processes done filling; [1]: set once they may touch. */
	int *barrier = shared_map(2 * sizeof(int));
	const char *after_fill = getenv("TOUCH_AFTER_FILL");
	pid_t parent = getpid();
	for (int p = 0; p < procs; p++) {
		if (fork() == 0) {
			size_t pages = size / PAGE;
			char *mem = private_map(size);
			for (size_t i = 0; i < pages; i++)
				memcpy(mem + i * PAGE, corpus + (i * 7 % n) * PAGE, PAGE);
			__atomic_add_fetch(&barrier[0], 1, __ATOMIC_SEQ_CST);
			while (after_fill && !__atomic_load_n(&barrier[1], __ATOMIC_SEQ_CST)) {
				if (getppid() != parent)
					_exit(1);
				usleep(1000);
			}
			uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(p + 1);
			unsigned char in;
			long done = 0;
			uint64_t start = now_ns(), deadline = start + 120000000000ull;
			while (done < per && now_ns() < deadline) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				char *page = mem + (x % pages) * PAGE;
				if (mincore(page, PAGE, &in) != 0 || (in & 1))
					continue;
				uint64_t t0 = now_ns();
				*(volatile char *)page;
				lat[p * per + done++] = now_ns() - t0;
			}
			took[p] = now_ns() - start;
			if (done < per)
				fprintf(stderr, "touch: only %ld of %ld touches met swapped pages\n", done, per);
			_exit(done == per ? 0 : 1);
		}
	}
	if (after_fill) {
		while (__atomic_load_n(&barrier[0], __ATOMIC_SEQ_CST) < procs) {
			int status;
			if (waitpid(-1, &status, WNOHANG) > 0) {
				fprintf(stderr, "touch: a process ended while filling (status %#x)\n", status);
				exit(1);
			}
			usleep(1000);
		}
		int status = system(after_fill);
		if (status != 0) {
			fprintf(stderr, "touch: TOUCH_AFTER_FILL failed (status %#x)\n", status);
			exit(1);
		}
		__atomic_store_n(&barrier[1], 1, __ATOMIC_SEQ_CST);
	}
	wait_all(procs);
	size_t all = (size_t)per * procs;
	qsort(lat, all, sizeof(uint64_t), cmp_u64);
	double sum = 0, wall = 0;
	size_t slow = 0;
	for (size_t i = 0; i < all; i++) {
		sum += (double)lat[i];
		slow += lat[i] > 100000;
	}
	for (int p = 0; p < procs; p++)
		wall = took[p] > wall ? (double)took[p] : wall;
	printf("faults %zu mean_us %.2f p50_us %.2f p99_us %.2f p999_us %.2f above_100us_pct %.3f\n",
	       all, sum / all / 1e3, lat[all / 2] / 1e3, lat[all * 99 / 100] / 1e3,
	       lat[all * 999 / 1000] / 1e3, 100.0 * slow / all);
	return 0;
}

static int usemem(size_t size, int procs)
{
	uint64_t *took = shared_map(sizeof(uint64_t) * procs);
	uint64_t start = now_ns();
	for (int p = 0; p < procs; p++) {
		if (fork() == 0) {
			size_t words = size / 8;
			uint64_t *mem = (uint64_t *)private_map(size);
			uint64_t t0 = now_ns();
			for (size_t i = 0; i < words; i++)
				mem[i] = i;
			took[p] = now_ns() - t0;
			for (size_t i = 0; i < words; i++)
				if (mem[i] != i) {
					fprintf(stderr, "touch: word %zu is wrong\n", i);
					_exit(1);
				}
			_exit(0);
		}
	}
	wait_all(procs);
	double mbps = 0;
	for (int p = 0; p < procs; p++)
		mbps += (double)size / 1e6 / ((double)took[p] / 1e9);
	printf("usemem %d x %zu MiB write_MBps %.0f elapsed_s %.2f\n", procs, size >> 20, mbps,
	       (double)(now_ns() - start) / 1e9);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 6 && strcmp(argv[1], "faults") == 0)
		return faults((size_t)atol(argv[2]) << 20, atoi(argv[3]), atol(argv[4]), argc - 5, argv + 5);
	if (argc == 4 && strcmp(argv[1], "usemem") == 0)
		return usemem((size_t)atol(argv[2]) << 20, atoi(argv[3]));
	fprintf(stderr, "usage: touch faults SIZE_MB PROCS FAULTS PAGES_FILE...\n"
			"       touch usemem SIZE_MB PROCS\n");
	return 2;
}
