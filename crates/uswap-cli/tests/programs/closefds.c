/* A forked child that closes every descriptor it did not open (as daemons
 * and spawn helpers do), opens some of its own, and goes on working with its
 * memory: it must neither be killed nor have the agent read its files. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t n = (48UL << 20) / 8;
    uint64_t *p = malloc(n * 8);
    for (size_t i = 0; i < n; i++) p[i] = i ^ 0xabcdef;
    pid_t pid = fork();
    if (pid == 0) {
        /* Work first (the child is adopted and evicted from meanwhile),
         * then close everything, open pipes over the low numbers, and work
         * on: evictions go on needing the agent. */
        uint64_t *q = malloc(n * 8);
        int pipes[64][2];
        for (int pass = 0; pass < 4; pass++) {
            if (pass == 1) {
                syscall(SYS_close_range, 3, ~0U, 0);
                for (int k = 0; k < 64; k++)
                    if (pipe(pipes[k])) return 2;
            }
            for (size_t i = 0; i < n; i++) q[i] = i * 5 + pass;
            for (size_t i = 0; i < n; i++)
                if (q[i] != i * 5 + pass || p[i] != (i ^ 0xabcdef)) { printf("child WRONG\n"); _exit(1); }
        }
        char buf[8];
        for (int k = 0; k < 64; k++) {
            write(pipes[k][1], "x", 1);
            if (read(pipes[k][0], buf, sizeof buf) != 1) { printf("child pipe\n"); _exit(1); }
        }
        printf("child ok\n");
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    printf("child %s %d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
