/* Gives memory back and maps new memory at the same addresses, as
 * allocators do: a block is unmapped whole and a new one takes its place,
 * then the middle of a block is unmapped and new memory takes the hole.
 * Each new block is filled as fast as possible; prints the peak of the
 * resident memory seen while filling the new memory (new memory where old
 * memory was must be picked up like any other), or WRONG. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rss.h"

#define MIB (1024UL * 1024UL)
#define BLOCK (256 * MIB)

static long peak;

static char *map_at(void *at, size_t len) {
    char *p = mmap(at, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (p == MAP_FAILED || (at && p != at)) { perror("reuse: mmap"); _exit(2); }
    return p;
}

static void fill(char *p, size_t len, uint64_t seed, int measure) {
    for (size_t i = 0; i < len; i += 4096) {
        *(uint64_t *)(p + i) = seed + i;
        if (measure && (i & (16 * MIB - 1)) == 0) {
            long r = rss_kb();
            if (r > peak) peak = r;
        }
    }
}

static int check(const char *p, size_t len, uint64_t seed) {
    for (size_t i = 0; i < len; i += 4096)
        if (*(const uint64_t *)(p + i) != seed + i) return 1;
    return 0;
}

int main(void) {
    char *a = map_at(NULL, BLOCK);
    fill(a, BLOCK, 1, 0);
    /* The whole block goes; a new one takes its place. */
    munmap(a, BLOCK);
    char *b = map_at(a, BLOCK);
    fill(b, BLOCK, 2, 1);
    /* The middle half of it goes; new memory takes the hole. */
    char *hole = b + BLOCK / 4;
    munmap(hole, BLOCK / 2);
    char *c = map_at(hole, BLOCK / 2);
    fill(c, BLOCK / 2, 3, 1);
    int bad = check(b, BLOCK / 4, 2) || check(c, BLOCK / 2, 3) ||
              check(b + 3 * BLOCK / 4, BLOCK / 4, 2 + 3 * BLOCK / 4);
    if (bad) { printf("WRONG\n"); return 1; }
    printf("peak %ld\n", peak);
    return 0;
}
