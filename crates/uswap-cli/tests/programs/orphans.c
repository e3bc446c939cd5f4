/* A program that forks children while its memory is being pushed out and
 * exits at once, leaving them to read their copies: run under `uswap run`,
 * every child must print "child K ok" and the run must end.
 *
 * The parent fills LEN_MIB MiB, then forks KIDS children while it writes
 * it again (so that forks land while the supervisor is evicting it), and
 * exits without waiting for them. Each child checks every word of its copy
 * (what the parent had written at its fork), twice.
 *
 *   orphans [LEN_MIB] [KIDS]
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Compressible, and unique to each page and pass. */
static uint64_t word(size_t i, uint64_t pass) {
    return (uint64_t)(i / 512) << 16 | pass << 8 | 0x77;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t len = (argc > 1 ? strtoul(argv[1], NULL, 0) : 32) << 20;
    int kids = argc > 2 ? atoi(argv[2]) : 4;
    size_t words = len / 8;
    uint64_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("orphans: mmap"); return 2; }
    for (size_t i = 0; i < words; i++) m[i] = word(i, 0);
    size_t part = words / kids;
    for (int k = 0; k < kids; k++) {
        /* Pass k+1 over part k; parts after it still hold pass 0. */
        for (size_t i = k * part; i < (k + 1) * part; i++) m[i] = word(i, k + 1);
        pid_t pid = fork();
        if (pid < 0) { perror("orphans: fork"); return 2; }
        if (pid == 0) {
            for (int round = 0; round < 2; round++) {
                for (size_t i = 0; i < words; i++) {
                    size_t p = i / part;
                    uint64_t want = word(i, p <= (size_t)k ? p + 1 : 0);
                    if (m[i] != want) {
                        printf("child %d BAD: word %zu is %#llx, not %#llx\n", k, i,
                               (unsigned long long)m[i], (unsigned long long)want);
                        _exit(1);
                    }
                }
            }
            printf("child %d ok\n", k);
            _exit(0);
        }
    }
    printf("parent done\n");
    return 0;
}
