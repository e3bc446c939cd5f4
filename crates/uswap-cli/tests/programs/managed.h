/* Whether this process's memory in start..end is managed: any part of it
 * shows as registered with a userfaultfd for missing faults (VmFlags "um"
 * in /proc/self/smaps). */
#ifndef USWAP_TEST_MANAGED_H
#define USWAP_TEST_MANAGED_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int registered(uintptr_t start, uintptr_t end) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) { perror("/proc/self/smaps"); exit(2); }
    char line[512];
    uintptr_t lo = 0, hi = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) {
            lo = a;
            hi = b;
        } else if (!strncmp(line, "VmFlags:", 8) && lo < end && start < hi) {
            found = strstr(line, " um") != NULL;
        }
    }
    fclose(f);
    return found;
}
#endif
