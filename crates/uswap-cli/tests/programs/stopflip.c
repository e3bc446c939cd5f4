/* A process of the run is stopped and continued over and over while
 * another needs room: run under `uswap run --memory-high 16M`, it must end
 * with "stopflip ok".
 *
 * A forked child fills CHILD_MIB and reads it over and over, checking
 * every word. Once the supervisor manages its memory, the parent fills
 * PARENT_MIB (more than the limit), then ROUNDS times: stops the child
 * (SIGSTOP, waited for), reads and rewrites the next WINDOW_MIB of its own
 * memory, which needs room, and continues the child. The child's folios go back to the
 * reclaimer as it runs again, so a stop often lands while the reclaimer
 * asks the child's agent to move pages out: that answer comes only after
 * SIGCONT, which the parent sends only once its own memory is done. A
 * supervisor whose faults wait for that answer hangs the run; the parent's
 * alarm then says so ("BAD: stalled").
 *
 *   stopflip [ROUNDS [CHILD_MIB [PARENT_MIB [WINDOW_MIB [RUN_US]]]]]
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "managed.h"

#define MIB (1024UL * 1024UL)
/* How long one round of the parent may take before it counts as stalled. */
#define ROUND_SECONDS 20

static uint64_t word(size_t i, uint64_t salt) { return i * 2654435761u ^ salt; }

static uint64_t *map(size_t bytes) {
    uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("stopflip: mmap"); exit(2); }
    return m;
}

static pid_t child_pid;

static void stalled(int sig) {
    (void)sig;
    static const char msg[] = "BAD: stalled: a round took longer than it may\n";
    kill(child_pid, SIGKILL);
    if (write(1, msg, sizeof msg - 1) < 0) _exit(3);
    _exit(1);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rounds = argc > 1 ? atoi(argv[1]) : 600;
    size_t child = (argc > 2 ? strtoul(argv[2], NULL, 0) : 12) * MIB;
    size_t parent = (argc > 3 ? strtoul(argv[3], NULL, 0) : 24) * MIB;
    size_t window = (argc > 4 ? strtoul(argv[4], NULL, 0) : 4) * MIB;
    if (window == 0 || parent % window) { printf("stopflip: PARENT_MIB must be a multiple of WINDOW_MIB\n"); return 2; }
    int ready[2];
    if (pipe(ready) != 0) { perror("stopflip: pipe"); return 2; }
    pid_t pid = fork();
    if (pid < 0) { perror("stopflip: fork"); return 2; }
    if (pid == 0) {
        uint64_t *m = map(child);
        for (size_t i = 0; i < child / 8; i++) m[i] = word(i, 0xc1);
        struct timespec tick = {0, 10 * 1000 * 1000};
        for (int waited = 0; !registered((uintptr_t)m, (uintptr_t)m + child); waited++) {
            if (waited > 3000) { printf("child never managed\n"); _exit(3); }
            nanosleep(&tick, NULL);
        }
        if (write(ready[1], "r", 1) != 1) _exit(3);
        for (;;)
            for (size_t i = 0; i < child / 8; i++)
                if (m[i] != word(i, 0xc1)) {
                    printf("BAD: the child's word %zu\n", i);
                    _exit(1);
                }
    }
    child_pid = pid;
    char r;
    if (read(ready[0], &r, 1) != 1) { printf("BAD: the child ended early\n"); return 1; }
    signal(SIGALRM, stalled);
    uint64_t *m = map(parent);
    /* Each window's words carry the round that last wrote them. */
    uint64_t *salt = calloc(parent / window, sizeof *salt);
    if (!salt) { perror("stopflip: calloc"); return 2; }
    for (size_t i = 0; i < parent / 8; i++) m[i] = word(i, 0);
    long run_us = argc > 5 ? atol(argv[5]) : 1000;
    struct timespec run = {run_us / 1000000, run_us % 1000000 * 1000};
    for (int k = 0; k < rounds; k++) {
        int status;
        kill(pid, SIGSTOP);
        if (waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status)) {
            printf("BAD: the child did not stop (status %#x)\n", status);
            return 1;
        }
        alarm(ROUND_SECONDS);
        size_t w = (size_t)k % (parent / window), first = w * window / 8;
        for (size_t i = first; i < first + window / 8; i++) {
            if (m[i] != word(i, salt[w])) {
                printf("BAD: the parent's word %zu in round %d\n", i, k);
                return 1;
            }
            m[i] = word(i, salt[w] + 1);
        }
        salt[w]++;
        alarm(0);
        kill(pid, SIGCONT);
        /* The child runs a while: its folios go back to the reclaimer. */
        nanosleep(&run, NULL);
    }
    kill(pid, SIGKILL);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
        printf("BAD: the child (status %#x)\n", status);
        return 1;
    }
    printf("stopflip ok\n");
    return 0;
}
