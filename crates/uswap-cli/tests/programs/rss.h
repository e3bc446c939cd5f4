/* The resident memory of this process, in KiB (VmRSS), or -1. */
#ifndef USWAP_TEST_RSS_H
#define USWAP_TEST_RSS_H
#include <stdio.h>

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}
#endif
