/* A program that moves and grows a mapping whose ends are not on a 64 KiB
 * boundary, as glibc's realloc moves a large block, once the supervisor
 * manages it and after its pages were pushed out: run under `uswap run`,
 * it must end with "remap ok" and read back every byte it wrote.
 *
 * The mapping starts 4 KiB past a 64 KiB boundary and ends 4 KiB past
 * another, so that with 64 KiB folios it holds whole folios and a part of
 * one at each end. It waits until the kernel shows it registered with a
 * userfaultfd (VmFlags "um" in /proc/self/smaps), fills BALLAST MiB more
 * to push it out, then moves it elsewhere (mremap MREMAP_FIXED) and grows
 * it in place or by a move (MREMAP_MAYMOVE), checking every word after
 * each step.
 *
 * On Linux 6.17 and later, which move a range of several mappings in one
 * call, it also moves the mapping whole twice more: once split in three
 * by an mprotect of one page inside it, and once with a mapping made just
 * before right after its end (which a scan has not registered yet). The
 * kernel refuses both (EFAULT) where any of the mappings is registered
 * with a userfaultfd; the program alone sees them succeed.
 *
 *   remap [BALLAST_MIB]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include "managed.h"

#define K 1024UL
#define ALIGN (64 * K)
#define LEN (1024 * K)

/* Each page's words say which page it is and which fill wrote it: they
 * compress (so the pages do go out), and a page read from anywhere else,
 * or as zeros, is told apart. */
static uint64_t word(size_t i, uint64_t salt) {
    return (uint64_t)(i / 512) << 16 | salt << 8 | 0x5a;
}

static void fill(uint64_t *w, size_t words, uint64_t salt) {
    for (size_t i = 0; i < words; i++) w[i] = word(i, salt);
}

static int check(const uint64_t *w, size_t words, uint64_t salt, const char *when) {
    for (size_t i = 0; i < words; i++) {
        uint64_t want = word(i, salt);
        if (w[i] != want) {
            printf("BAD %s: word %zu of %zu is %#llx, not %#llx\n", when, i, words,
                   (unsigned long long)w[i], (unsigned long long)want);
            return 1;
        }
    }
    return 0;
}

/* A free range of `len` bytes whose start is `offset` past a 64 KiB
 * boundary (reserved as PROT_NONE; mapped over with MAP_FIXED). */
static char *reserve(size_t len, size_t offset) {
    char *r = mmap(NULL, len + 2 * ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) { perror("remap: mmap"); exit(2); }
    uintptr_t at = ((uintptr_t)r + ALIGN - 1) / ALIGN * ALIGN + offset;
    return (char *)at;
}

/* Whether the kernel is MAJOR.MINOR or later. */
static int kernel_at_least(int major, int minor) {
    struct utsname u;
    int a = 0, b = 0;
    if (uname(&u) || sscanf(u.release, "%d.%d", &a, &b) != 2) return 0;
    return a > major || (a == major && b >= minor);
}

/* Moves `len` bytes at `m` whole to a fresh range 4 KiB past a 64 KiB
 * boundary (several mappings at once where `m` spans them). */
static uint64_t *move_whole(uint64_t *m, size_t len, const char *what) {
    char *to = reserve(len, 4 * K);
    void *r = mremap(m, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    if (r == MAP_FAILED) {
        printf("remap: mremap (%s): %s\n", what, strerror(errno));
        exit(2);
    }
    return r;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t ballast = (argc > 1 ? strtoul(argv[1], NULL, 0) : 32) << 20;
    size_t len = LEN;
    size_t words = len / 8;
    char *at = reserve(len, 4 * K);
    uint64_t *m = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) { perror("remap: mmap"); exit(2); }
    fill(m, words, 1);
    /* Wait for the supervisor's scan to manage it. */
    struct timespec tick = {0, 10 * 1000 * 1000};
    int waited = 0;
    while (!registered((uintptr_t)m, (uintptr_t)m + len)) {
        if (++waited > 3000) { printf("never managed\n"); return 3; }
        nanosleep(&tick, NULL);
    }
    /* Push it out. */
    char *b = malloc(ballast);
    if (!b) { perror("remap: malloc"); exit(2); }
    memset(b, 0x5a, ballast);
    if (check(m, words, 1, "before the moves")) return 1;

    /* Moved whole to another address, also 4 KiB past a boundary. */
    m = move_whole(m, len, "a move");
    if (check(m, words, 1, "after a move")) return 1;

    if (kernel_at_least(6, 17)) {
        /* Split in three (one page inside made read-only), pushed out,
         * moved whole, then made one mapping again. */
        if (!registered((uintptr_t)m, (uintptr_t)m + len)) { printf("not managed after a move\n"); return 3; }
        char *page = (char *)m + 8 * ALIGN;
        if (mprotect(page, 4 * K, PROT_READ)) { perror("remap: mprotect"); return 2; }
        memset(b, 0x69, ballast);
        m = move_whole(m, len, "a move of three mappings");
        if (check(m, words, 1, "after a move of three mappings")) return 1;
        page = (char *)m + 8 * ALIGN;
        if (mprotect(page, 4 * K, PROT_READ | PROT_WRITE)) { perror("remap: mprotect"); return 2; }

        /* A mapping made right after its end (over the rest of the
         * reservation, which leaves room for it), moved with it at once. */
        uint64_t *tail = mmap((char *)m + len, ALIGN, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (tail == MAP_FAILED) { perror("remap: mmap (tail)"); return 2; }
        fill(tail, ALIGN / 8, 3);
        m = move_whole(m, len + ALIGN, "a move with a new mapping");
        if (check(m, words, 1, "after a move with a new mapping")) return 1;
        if (check(m + words, ALIGN / 8, 3, "the new mapping after the move")) return 1;
        if (munmap((char *)m + len, ALIGN)) { perror("remap: munmap"); return 2; }
    }

    /* Pushed out again, then grown by half (in place or by a move, as the
     * kernel finds room). */
    memset(b, 0xa5, ballast);
    m = mremap(m, len, len + len / 2, MREMAP_MAYMOVE);
    if (m == MAP_FAILED) { perror("remap: mremap (grow)"); return 2; }
    if (check(m, words, 1, "after growing")) return 1;
    for (size_t i = words; i < words + words / 2; i++) {
        if (m[i] != 0) { printf("BAD after growing: new word %zu is %#llx\n", i, (unsigned long long)m[i]); return 1; }
    }
    fill(m, words + words / 2, 2);
    memset(b, 0x3c, ballast);
    if (check(m, words + words / 2, 2, "at the end")) return 1;
    printf("remap ok\n");
    return 0;
}
