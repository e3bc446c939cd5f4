/* A process of the run dies while a child it forked without the C
 * library's fork handlers (_Fork, as a raw clone does) lives on with copies
 * of its descriptors, the agent's socket among them: run under `uswap run
 * --memory-high 16M`, it must end with "rawfork ok".
 *
 * ROUNDS times, the program forks A, which fills A_MIB (more than the
 * limit, so that the supervisor keeps moving A's pages out), forks C with
 * _Fork, and writes its memory over and over. C only sleeps. Once A has
 * written its memory twice, the program kills A (SIGKILL, with a request
 * to A's agent perhaps in flight) and reaps it. Then it fills FILL_MIB
 * itself. Each A after the first, and the fill, need room the supervisor
 * makes only by moving pages out: a supervisor that waits for a dead A's
 * agent to answer waits while its C keeps the socket open, and the run
 * hangs (C sleeps for ten minutes). At the end the program ends every C
 * and checks its memory.
 *
 *   rawfork [A_MIB [FILL_MIB [ROUNDS]]]
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)

static uint64_t *map(size_t bytes) {
    uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("rawfork: mmap"); exit(2); }
    return m;
}

/* Forks A, which fills and writes its memory over and over after forking
 * C with _Fork; returns once A has written it twice, with C's pid. */
static pid_t start_a(size_t bytes, pid_t *c) {
    int ready[2];
    if (pipe(ready)) { perror("rawfork: pipe"); exit(2); }
    pid_t a = fork();
    if (a < 0) { perror("rawfork: fork"); exit(2); }
    if (a == 0) {
        uint64_t *m = map(bytes);
        for (size_t i = 0; i < bytes / 8; i++) m[i] = i;
        pid_t child = _Fork();
        if (child < 0) { perror("rawfork: _Fork"); _exit(2); }
        if (child == 0) {
            struct timespec long_time = {600, 0};
            nanosleep(&long_time, NULL);
            _exit(0);
        }
        if (write(ready[1], &child, sizeof child) != sizeof child) _exit(2);
        for (uint64_t pass = 1;; pass++) {
            for (size_t i = 0; i < bytes / 8; i++) m[i] = i ^ pass;
            if (pass == 2 && write(ready[1], "r", 1) != 1) _exit(2);
        }
    }
    char r;
    if (read(ready[0], c, sizeof *c) != sizeof *c || read(ready[0], &r, 1) != 1) {
        printf("A did not start\n");
        exit(2);
    }
    close(ready[0]);
    close(ready[1]);
    return a;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t a_bytes = (argc > 1 ? strtoul(argv[1], NULL, 0) : 32) * MIB;
    size_t fill = (argc > 2 ? strtoul(argv[2], NULL, 0) : 48) * MIB;
    int rounds = argc > 3 ? atoi(argv[3]) : 10;
    pid_t cs[64];
    if (rounds > 64) rounds = 64;
    for (int k = 0; k < rounds; k++) {
        /* Each A but the first needs room: it waits if a reclaimer waits
         * on the last one's agent. */
        pid_t a = start_a(a_bytes, &cs[k]);
        kill(a, SIGKILL);
        int status;
        if (waitpid(a, &status, 0) != a) { perror("rawfork: waitpid"); return 2; }
    }
    uint64_t *m = map(fill);
    for (size_t i = 0; i < fill / 8; i++) m[i] = i * 2654435761u;
    for (int k = 0; k < rounds; k++) kill(cs[k], SIGKILL);
    for (size_t i = 0; i < fill / 8; i++)
        if (m[i] != i * 2654435761u) { printf("BAD: word %zu\n", i); return 1; }
    printf("rawfork ok\n");
    return 0;
}
