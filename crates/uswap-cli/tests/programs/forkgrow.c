/* A forked child (no exec) that grows far past the limit: it is evicted
 * from like its parent. Prints "child ok RSS_KB" (its resident memory while
 * it holds 192 MiB) and "parent ok". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define MIB (1024UL * 1024UL)

#include "rss.h"

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t n = 32 * MIB / 8;
    uint64_t *p = malloc(n * 8);
    for (size_t i = 0; i < n; i++) p[i] = i * 3 + 1;
    pid_t pid = fork();
    if (pid == 0) {
        size_t m = 192 * MIB / 8;
        uint64_t *q = malloc(m * 8);
        long rss = 0;
        for (uint64_t pass = 0; pass < 3; pass++) {
            for (size_t i = 0; i < m; i++) q[i] = i * 7 + pass;
            for (size_t i = 0; i < m; i++)
                if (q[i] != i * 7 + pass) { printf("child WRONG q\n"); _exit(1); }
            long r = rss_kb();
            if (r > rss) rss = r;
        }
        for (size_t i = 0; i < n; i++)
            if (p[i] != i * 3 + 1) { printf("child WRONG p\n"); _exit(1); }
        printf("child ok %ld\n", rss);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    for (size_t i = 0; i < n; i++)
        if (p[i] != i * 3 + 1) { printf("parent WRONG\n"); return 1; }
    printf("parent ok %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return 0;
}
