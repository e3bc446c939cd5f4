/* Two processes (a parent and its forked child) writing their own memory
 * at the same time, page by page in random order, each three times its
 * share of the limit: their faults, and so the reclaimer's queue, take
 * turns between the two. Checks every word; prints "twotouch ok". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#define MIB (1024UL * 1024UL)
#define PAGE 4096UL

static int touch(uint64_t seed) {
    size_t pages = 24 * MIB / PAGE;
    uint64_t *p = malloc(pages * PAGE);
    if (!p) return 1;
    uint64_t x = seed;
    for (int pass = 1; pass <= 2; pass++) {
        for (size_t k = 0; k < 4 * pages; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t i = x % pages;
            p[i * (PAGE / 8)] = i * 31 + pass;
        }
        for (size_t i = 0; i < pages; i++) p[i * (PAGE / 8)] = i * 31 + pass;
        for (size_t i = 0; i < pages; i++)
            if (p[i * (PAGE / 8)] != i * 31 + pass) return 1;
    }
    return 0;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork();
    if (pid < 0) return 1;
    int bad = touch(pid == 0 ? 0x9E3779B97F4A7C15ull : 0xD1B54A32D192ED03ull);
    if (pid == 0) _exit(bad);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = 1;
    printf(bad ? "twotouch WRONG\n" : "twotouch ok\n");
    return bad;
}
