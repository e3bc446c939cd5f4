/* A process of the run stops while another needs room: run under
 * `uswap run --memory-high 16M`, it must end with "stopped ok".
 *
 * A forked child fills CHILD_MIB of memory, waits until the supervisor
 * manages it (VmFlags "um" in /proc/self/smaps), and stops itself
 * (SIGSTOP), as under a debugger or job control. The parent, once the
 * child is stopped, fills PARENT_MIB, more than the limit, so that reclaim
 * must evict, and the child's folios are the oldest; it checks its memory,
 * continues the child, which checks its own, and reports. A supervisor
 * that asks the stopped child's agent to move pages out waits for an
 * answer that comes only after SIGCONT, which the parent sends only once
 * its own memory is done: the run hangs.
 *
 *   stopped [CHILD_MIB [PARENT_MIB]]
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

static uint64_t *fill(size_t bytes, uint64_t salt) {
    uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("stopped: mmap"); exit(2); }
    for (size_t i = 0; i < bytes / 8; i++) m[i] = i * 2654435761u ^ salt;
    return m;
}

static int check(const uint64_t *m, size_t bytes, uint64_t salt) {
    for (size_t i = 0; i < bytes / 8; i++)
        if (m[i] != (i * 2654435761u ^ salt)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t child = (argc > 1 ? strtoul(argv[1], NULL, 0) : 12) * MIB;
    size_t parent = (argc > 2 ? strtoul(argv[2], NULL, 0) : 48) * MIB;
    pid_t pid = fork();
    if (pid < 0) { perror("stopped: fork"); return 2; }
    if (pid == 0) {
        uint64_t *m = fill(child, 0xc1);
        struct timespec tick = {0, 10 * 1000 * 1000};
        for (int waited = 0; !registered((uintptr_t)m, (uintptr_t)m + child); waited++) {
            if (waited > 3000) { printf("child never managed\n"); _exit(3); }
            nanosleep(&tick, NULL);
        }
        raise(SIGSTOP);
        _exit(check(m, child, 0xc1) ? 1 : 0);
    }
    int status;
    if (waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status)) {
        printf("the child did not stop (status %#x)\n", status);
        return 2;
    }
    uint64_t *m = fill(parent, 0xa7);
    if (check(m, parent, 0xa7)) { printf("BAD: the parent's memory\n"); return 1; }
    kill(pid, SIGCONT);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        printf("BAD: the child (status %#x)\n", status);
        return 1;
    }
    printf("stopped ok\n");
    return 0;
}
