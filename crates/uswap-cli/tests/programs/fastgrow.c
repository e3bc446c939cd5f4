/* Mallocs 512 MiB and touches it as fast as it can, printing the peak of
 * its resident memory: new memory must be picked up while it is filled. */
#include <stdio.h>
#include <stdlib.h>

#include "rss.h"

int main(void) {
    size_t n = 512UL << 20;
    char *p = malloc(n);
    long peak = 0;
    for (size_t i = 0; i < n; i += 4096) {
        p[i] = (char)(i >> 12);
        if ((i & ((1 << 24) - 1)) == 0) {
            long r = rss_kb();
            if (r > peak) peak = r;
        }
    }
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (char)(i >> 12)) { printf("WRONG\n"); return 1; }
    printf("peak %ld\n", peak);
    return 0;
}
