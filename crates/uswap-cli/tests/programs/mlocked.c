/* A program that locks its memory (mlockall), as databases and VPN daemons
 * do to keep secrets and latency off swap, then works with more memory than
 * its limit. mlockall populates every mapping, the agent's own included:
 * none of them may hold it for ever. Its locked memory is not evicted. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int locked = mlockall(MCL_CURRENT) == 0;
    size_t n = (48UL << 20) / 8;
    uint64_t *p = malloc(n * 8);
    if (!p) return 2;
    for (size_t i = 0; i < n; i++) p[i] = i ^ 0x5a5a;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += p[i] != (i ^ 0x5a5a);
    printf("locked %d bad %zu\n", locked, bad);
    return bad != 0;
}
