/* The floor of a userfaultfd fault on this machine, by where the handler
 * runs: one thread reads 20,000 fresh pages one after the other, and a
 * handler thread answers each fault with one 4 KiB UFFDIO_COPY (which wakes
 * the reader). Six placements, each run in turn:
 *
 *   poll, any CPU:     the handler sleeps in poll between faults, and the
 *                      scheduler places both threads (the descriptor is
 *                      non-blocking: poll on a blocking one answers
 *                      POLLERR at once)
 *   poll, same CPU:    both pinned to CPU 0
 *   poll, other CPU:   handler on CPU 0, reader on CPU 1
 *   spin, other CPU:   the handler reads a non-blocking descriptor in a
 *                      loop (never sleeps), reader on CPU 1
 *   spin, any CPU:     the same, both placed by the scheduler (as the
 *                      runtime's event thread and a program's thread are)
 *   poll, one per CPU: a handler pinned to each of CPUs 0 and 1, both
 *                      asleep in poll, the reader placed by the scheduler:
 *                      every fault wakes both, and the one on the reader's
 *                      CPU answers first (the runtime's event readers)
 *
 *   cc -O2 -Wall -pthread bench/probes/uffd-roundtrip.c -o /tmp/rt && /tmp/rt
 *
 * Prints p50/p90/p99 of each, in microseconds, after how this machine's
 * idle CPUs wait where it says (a guest's haltpoll cpuidle driver): a
 * placement that wakes a thread on another CPU pays for that CPU's way
 * out of idle. In the build machine's VM, booted with
 * haltpoll.guest_halt_poll_ns=0 (an idle vCPU halts at once, and its
 * wake-up goes through the host), "poll, other CPU" gave p50 62 us; with
 * the KVM default of 200000 ns written to
 * /sys/module/haltpoll/parameters/guest_halt_poll_ns, 6.2 us ("poll, same
 * CPU" 3.4 and 3.3 us). Needs 2 CPUs and permission to use userfaultfd. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAULTS 20000
#define PAGE 4096UL

struct setup {
	const char *name;
	int spin;
	int handler_cpu; /* -1: any; -2: one handler on each of CPUs 0 and 1 */
	int reader_cpu;
};

static int uffd;
static int spin;
static int handler_cpu;
static volatile int stop;
static char page[PAGE] __attribute__((aligned(4096)));

static void pin(int cpu)
{
	cpu_set_t set;
	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set);
}

static void *handler(void *arg)
{
	struct pollfd p = { .fd = uffd, .events = POLLIN };
	pin(handler_cpu == -2 ? (int)(long)arg : handler_cpu);
	while (!stop) {
		struct uffd_msg m;
		if (!spin && poll(&p, 1, 10) <= 0)
			continue;
		if (read(uffd, &m, sizeof m) != sizeof m) {
			/* EAGAIN: nothing yet, or the other handler took it. */
			if (errno == EAGAIN)
				continue;
			perror("read");
			exit(1);
		}
		struct uffdio_copy c = {
			.dst = m.arg.pagefault.address & ~(PAGE - 1),
			.src = (unsigned long)page,
			.len = PAGE,
		};
		if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) {
			perror("UFFDIO_COPY");
			exit(1);
		}
	}
	return NULL;
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void measure(const struct setup *s)
{
	static double lat[FAULTS];
	size_t len = FAULTS * PAGE;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0) {
		perror("userfaultfd");
		exit(1);
	}
	struct uffdio_api api = { .api = UFFD_API };
	if (ioctl(uffd, UFFDIO_API, &api)) {
		perror("UFFDIO_API");
		exit(1);
	}
	char *area = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdio_register reg = {
		.range = { .start = (unsigned long)area, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (area == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("mapping and registering");
		exit(1);
	}
	spin = s->spin;
	handler_cpu = s->handler_cpu;
	stop = 0;
	pthread_t t[2];
	int handlers = s->handler_cpu == -2 ? 2 : 1;
	for (long h = 0; h < handlers; h++)
		pthread_create(&t[h], NULL, handler, (void *)h);
	cpu_set_t all;
	sched_getaffinity(0, sizeof all, &all);
	pin(s->reader_cpu);
	for (int i = 0; i < FAULTS; i++) {
		double t0 = now_us();
		(void)*(volatile char *)(area + i * PAGE);
		lat[i] = now_us() - t0;
	}
	sched_setaffinity(0, sizeof all, &all);
	stop = 1;
	for (int h = 0; h < handlers; h++)
		pthread_join(t[h], NULL);
	munmap(area, len);
	close(uffd);
	qsort(lat, FAULTS, sizeof lat[0], by_value);
	printf("%-17s p50 %6.2f  p90 %6.2f  p99 %6.2f us\n", s->name, lat[FAULTS / 2],
	       lat[FAULTS * 9 / 10], lat[FAULTS * 99 / 100]);
}

static int memset_page(void)
{
	memset(page, 0x5a, sizeof page);
	return 0;
}

int main(void)
{
	static const struct setup setups[] = {
		{ "poll, any CPU", 0, -1, -1 },
		{ "poll, same CPU", 0, 0, 0 },
		{ "poll, other CPU", 0, 0, 1 },
		{ "spin, other CPU", 1, 0, 1 },
		{ "spin, any CPU", 1, -1, -1 },
		{ "poll, one per CPU", 0, -2, -1 },
	};
	FILE *hp = fopen("/sys/module/haltpoll/parameters/guest_halt_poll_ns", "r");
	long poll_ns;
	if (hp && fscanf(hp, "%ld", &poll_ns) == 1)
		printf("idle CPUs poll for   %ld ns before they halt (haltpoll)\n", poll_ns);
	if (hp)
		fclose(hp);
	memset_page();
	for (size_t i = 0; i < sizeof setups / sizeof setups[0]; i++)
		measure(&setups[i]);
	return 0;
}
