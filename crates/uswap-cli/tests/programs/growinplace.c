/* Grows a managed mapping in place, as glibc's realloc grows a large block
 * (mremap without MREMAP_MAYMOVE: no event tells the supervisor), then fills
 * the grown part page by page and checks all of it. Until the supervisor
 * manages the grown part, every page there is a fault of its own. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>

#include "managed.h"

int main(void) {
    size_t small = 8UL << 20, big = 64UL << 20;
    char *p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("growinplace: mmap"); return 2; }
    /* Room right after the first part, for the mapping to grow into. */
    if (munmap(p + small, big - small)) { perror("growinplace: munmap"); return 2; }
    for (size_t i = 0; i < small; i += 4096) p[i] = (char)(i >> 12);
    /* Wait for the supervisor's scan to manage the first part. */
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int waited = 0; !registered((uintptr_t)p, (uintptr_t)p + small); waited++) {
        if (waited > 3000) { printf("never managed\n"); return 3; }
        nanosleep(&tick, NULL);
    }
    if (mremap(p, small, big, 0) != p) { perror("growinplace: mremap"); return 2; }
    for (size_t i = small; i < big; i += 4096) p[i] = (char)(i >> 12);
    for (size_t i = 0; i < big; i += 4096)
        if (p[i] != (char)(i >> 12)) { printf("WRONG at byte %zu\n", i); return 1; }
    printf("grew %zu pages in place\ngrowinplace ok\n", (big - small) / 4096);
    return 0;
}
