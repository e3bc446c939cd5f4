/* Memory the program told the kernel not to hand to a forked child as it
 * is: run under `uswap run --memory-high 16M`, it must end with
 * "forkadvice ok".
 *
 * Three mappings of REGION_MIB (and five pages) each, filled with their own patterns:
 * WIPE marked MADV_WIPEONFORK (a child gets it empty: zeros, as glibc's
 * arc4random state relies on), GONE marked MADV_DONTFORK (a child has no
 * mapping there at all), KEEP plain. Once all three are managed, more than
 * the limit is filled, so that they go out, and the program forks. The
 * child must read zeros in WIPE and the pattern in KEEP; where GONE was it
 * maps new memory (MAP_FIXED_NOREPLACE, so the hole is GONE's), waits until
 * that is managed, and must read zeros there too. After the child, the
 * parent must still read all three patterns. Then, eight times, the
 * program fills more than the limit again, forks, and marks KEEP with one
 * advice or the other right after the fork: the child must read KEEP as
 * it was copied.
 *
 *   forkadvice [REGION_MIB [FILL_MIB]]
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "managed.h"

#define MIB (1024UL * 1024UL)

static uint64_t *map_at(void *at, size_t bytes, int flags) {
    uint64_t *m = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (m == MAP_FAILED) { perror("forkadvice: mmap"); exit(2); }
    return m;
}

static void fill(uint64_t *m, size_t bytes, uint64_t salt) {
    for (size_t i = 0; i < bytes / 8; i++) m[i] = i * 2654435761u ^ salt;
}

/* The first word that is not the pattern (or zero, for salt 0), or -1. */
static long wrong(const uint64_t *m, size_t bytes, uint64_t salt, int zeros) {
    for (size_t i = 0; i < bytes / 8; i++)
        if (m[i] != (zeros ? 0 : (i * 2654435761u ^ salt))) return (long)i;
    return -1;
}

static void wait_managed(const void *m, size_t bytes, const char *what) {
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int waited = 0; !registered((uintptr_t)m, (uintptr_t)m + bytes); waited++) {
        if (waited > 3000) { printf("%s never managed\n", what); exit(3); }
        nanosleep(&tick, NULL);
    }
}

static int report(const char *who, const char *what, long at) {
    if (at < 0) return 0;
    printf("BAD: %s reads wrong bytes in %s at word %ld\n", who, what, at);
    return 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Five pages over whole MiBs: where the three mappings adjoin, the
     * advice cuts folios in part. */
    size_t region = (argc > 1 ? strtoul(argv[1], NULL, 0) : 4) * MIB + 5 * 4096;
    size_t filler = (argc > 2 ? strtoul(argv[2], NULL, 0) : 48) * MIB;
    uint64_t *wipe = map_at(NULL, region, 0);
    uint64_t *gone = map_at(NULL, region, 0);
    uint64_t *keep = map_at(NULL, region, 0);
    if (madvise(wipe, region, MADV_WIPEONFORK) || madvise(gone, region, MADV_DONTFORK)) {
        perror("forkadvice: madvise");
        return 2;
    }
    fill(wipe, region, 0x31);
    fill(gone, region, 0x32);
    fill(keep, region, 0x33);
    wait_managed(wipe, region, "WIPE");
    wait_managed(gone, region, "GONE");
    wait_managed(keep, region, "KEEP");
    uint64_t *more = map_at(NULL, filler, 0);
    fill(more, filler, 0x34);

    pid_t pid = fork();
    if (pid < 0) { perror("forkadvice: fork"); return 2; }
    if (pid == 0) {
        int bad = report("the child", "WIPE", wrong(wipe, region, 0, 1));
        bad |= report("the child", "KEEP", wrong(keep, region, 0x33, 0));
        uint64_t *fresh = map_at(gone, region, MAP_FIXED_NOREPLACE);
        if (fresh != gone) { printf("new memory not at GONE's address\n"); _exit(2); }
        wait_managed(fresh, region, "new memory at GONE");
        bad |= report("the child", "new memory at GONE", wrong(fresh, region, 0, 1));
        /* Written and read back, as the child's own. */
        fill(fresh, region, 0x35);
        fill(wipe, region, 0x36);
        bad |= report("the child", "its new memory", wrong(fresh, region, 0x35, 0));
        bad |= report("the child", "WIPE written", wrong(wipe, region, 0x36, 0));
        _exit(bad);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        printf("BAD: the child (status %#x)\n", status);
        return 1;
    }
    int bad = report("the parent", "WIPE", wrong(wipe, region, 0x31, 0));
    bad |= report("the parent", "GONE", wrong(gone, region, 0x32, 0));
    bad |= report("the parent", "KEEP", wrong(keep, region, 0x33, 0));
    bad |= report("the parent", "the filler", wrong(more, filler, 0x34, 0));
    if (bad) return 1;

    /* Advice given right after a fork is not the child's: it has KEEP as
     * it was copied, whichever of the two the parent marks it with while
     * the child reads it. */
    for (int round = 0; round < 8; round++) {
        int wipe_it = round % 2;
        fill(more, filler, 0x40 + round);
        pid = fork();
        if (pid < 0) { perror("forkadvice: fork"); return 2; }
        if (pid == 0) _exit(report("a child", "KEEP advised after its fork", wrong(keep, region, 0x33, 0)));
        if (madvise(keep, region, wipe_it ? MADV_WIPEONFORK : MADV_DONTFORK)) {
            perror("forkadvice: madvise");
            return 2;
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
            printf("BAD: round %d (%s right after the fork)\n", round,
                   wipe_it ? "MADV_WIPEONFORK" : "MADV_DONTFORK");
            return 1;
        }
        if (madvise(keep, region, wipe_it ? MADV_KEEPONFORK : MADV_DOFORK)) {
            perror("forkadvice: madvise");
            return 2;
        }
    }
    if (report("the parent", "KEEP", wrong(keep, region, 0x33, 0))) return 1;
    printf("forkadvice ok\n");
    return 0;
}
