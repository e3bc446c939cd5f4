/* The cost of a fork of a small process: how long fork() takes to return
 * in the parent, and fork, the child's _exit and the parent's wait
 * together, averaged over N forks (default 500). Run it alone and under
 * `uswap run` to see what serving the child adds:
 *
 *   cc -O2 bench/probes/fork-cost.c -o /tmp/fork-cost
 *   /tmp/fork-cost; uswap run --memory-high 256M -- /tmp/fork-cost
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 500;
    double forked = 0, waited = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        pid_t pid = fork();
        if (pid < 0) { perror("fork-cost: fork"); return 2; }
        if (pid == 0) _exit(0);
        double t1 = now_us();
        if (waitpid(pid, NULL, 0) != pid) { perror("fork-cost: waitpid"); return 2; }
        forked += t1 - t0;
        waited += now_us() - t0;
    }
    printf("fork %.0f us, fork+exit+wait %.0f us (mean of %d)\n", forked / n, waited / n, n);
    return 0;
}
