/* The kernel fact behind `Uffd::no_mapping` (crates/uswap/src/mm/uffd.rs):
 * UFFDIO_COPY can answer ENOENT while the move that took its page away
 * still has its event unread. The copy looks for unread events (EAGAIN)
 * and looks the mapping up (ENOENT) in two steps, and an mremap can come
 * in between. A runtime that took that ENOENT for "unmapped" would skip a
 * page that had moved. A write-protect change of a page nothing registers
 * looks for unread events under the address space's lock, so it answers
 * EAGAIN whenever that happens: the probe the runtime asks again with.
 *
 *   cc -O2 -pthread bench/probes/uffd-copy-enoent.c -o /tmp/enoent && /tmp/enoent [ROUNDS]
 *
 * Each round (a child process of its own): one thread copies to a page in
 * a loop while another moves that page away at a random moment; the loop
 * stops at the first answer that is neither success nor EEXIST. Prints how
 * many rounds ended in EAGAIN, and in ENOENT with and without an event
 * pending, and what the probe said in the ENOENT rounds. Exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096
/* The last page below the 47-bit limit, which nothing registers. */
#define PROBE_PAGE ((1UL << 47) - 2 * PG)

enum outcome { AGAIN, ENOENT_PENDING_PROBE_AGAIN, ENOENT_PENDING_PROBE_OTHER, ENOENT_QUIET, OTHER, OUTCOMES };
static const char *names[OUTCOMES] = {
    "EAGAIN",
    "ENOENT with the move's event unread, probe EAGAIN",
    "ENOENT with the move's event unread, probe not EAGAIN",
    "ENOENT with no event pending",
    "something else",
};

static char *from, *to;
static atomic_int go;

static void *mover(void *arg) {
    (void)arg;
    while (!atomic_load(&go))
        ;
    for (volatile int i = rand() % 20000; i > 0; i--)
        ;
    if (mremap(from, PG, PG, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED)
        perror("mremap");
    return NULL;
}

static enum outcome round_once(unsigned seed) {
    static char src[PG];
    srand(seed);
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API,
                             .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_EVENT_REMAP |
                                         UFFD_FEATURE_EVENT_UNMAP};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api)) {
        perror("userfaultfd");
        return OTHER;
    }
    char *a = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    to = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    from = a + PG;
    struct uffdio_register reg = {.range = {(unsigned long)a, 4 * PG},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(fd, UFFDIO_REGISTER, &reg)) {
        perror("UFFDIO_REGISTER");
        return OTHER;
    }
    pthread_t t;
    pthread_create(&t, NULL, mover, NULL);
    atomic_store(&go, 1);
    int e;
    for (;;) {
        struct uffdio_copy c = {.dst = (unsigned long)from, .src = (unsigned long)src, .len = PG,
                                .mode = UFFDIO_COPY_MODE_DONTWAKE};
        if (ioctl(fd, UFFDIO_COPY, &c) == 0)
            continue;
        e = errno;
        if (e != EEXIST)
            break;
    }
    struct uffdio_writeprotect w = {.range = {PROBE_PAGE, PG}, .mode = 0};
    int probe = ioctl(fd, UFFDIO_WRITEPROTECT, &w) ? errno : 0;
    struct pollfd p = {fd, POLLIN, 0};
    int pending = poll(&p, 1, 0) > 0;
    /* Read the move's events, so that the mover returns. */
    struct uffd_msg m;
    while (poll(&p, 1, 100) > 0 && read(fd, &m, sizeof m) > 0)
        ;
    pthread_join(t, NULL);
    if (e == EAGAIN)
        return AGAIN;
    if (e == ENOENT && pending)
        return probe == EAGAIN ? ENOENT_PENDING_PROBE_AGAIN : ENOENT_PENDING_PROBE_OTHER;
    if (e == ENOENT)
        return ENOENT_QUIET;
    fprintf(stderr, "copy: %s\n", strerror(e));
    return OTHER;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    int count[OUTCOMES] = {0};
    for (int r = 0; r < rounds; r++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(round_once(r));
        int status;
        waitpid(pid, &status, 0);
        count[WIFEXITED(status) && WEXITSTATUS(status) < OUTCOMES ? WEXITSTATUS(status) : OTHER]++;
    }
    printf("%d rounds of a copy against a move of its page:\n", rounds);
    for (int k = 0; k < OUTCOMES; k++)
        printf("  %-55s %d\n", names[k], count[k]);
    return 0;
}
