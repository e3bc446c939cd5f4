/* Two kernel facts uswap's moves out rely on (mm/scratch.rs, uswap-agent):
 *
 * 1. UFFDIO_MOVE works only inside the caller's own address space: a
 *    process holding another process's userfaultfd (the supervisor of
 *    `uswap run`) gets EINVAL, where UFFDIO_REGISTER and UFFDIO_COPY act on
 *    the descriptor's process whoever calls them. Hence the agent thread.
 * 2. A move through a descriptor is refused with EAGAIN while one of its
 *    events is unread (here: an unmap, whose munmap waits for the read).
 *    Hence moves through the program's own descriptor, under the gate that
 *    keeps events unread.
 *
 *   cc -O2 -pthread bench/probes/uffd-move.c -o /tmp/uffd-move && /tmp/uffd-move
 *
 * Prints one line per fact and exits 0 when both hold. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES (1ULL << 1)
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif

#define PAGE 4096

static int send_fd(int sock, int fd, void *buf, size_t n) {
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {buf, n};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &m, 0) < 0 ? -1 : 0;
}

static int recv_fd(int sock, void *buf, size_t n) {
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {buf, n};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(sock, &m, 0) <= 0) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

static long move(int uffd, char *dst, char *src, size_t len) {
    struct uffdio_move mv = {.dst = (__u64)dst, .src = (__u64)src, .len = len,
                             .mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES};
    return ioctl(uffd, UFFDIO_MOVE, &mv) == 0 ? 0 : errno;
}

static char *victim;
static void *unmap_one(void *arg) {
    (void)arg;
    munmap(victim, PAGE); /* waits until its event is read */
    return NULL;
}

int main(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
    pid_t pid = fork();
    if (pid == 0) {
        int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
        struct uffdio_api api = {.api = UFFD_API,
                                 .features = UFFD_FEATURE_MOVE | UFFD_FEATURE_PAGEFAULT_FLAG_WP |
                                             UFFD_FEATURE_EVENT_UNMAP};
        if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) return perror("userfaultfd"), 1;
        char *mem = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *scratch = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(mem, 'x', 4 * PAGE);
        struct uffdio_register rm = {.range = {(__u64)mem, 4 * PAGE},
                                     .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
        struct uffdio_register rs = {.range = {(__u64)scratch, 4 * PAGE}, .mode = UFFDIO_REGISTER_MODE_WP};
        if (ioctl(uffd, UFFDIO_REGISTER, &rm) || ioctl(uffd, UFFDIO_REGISTER, &rs))
            return perror("register"), 1;
        char *addrs[2] = {mem, scratch};
        send_fd(sv[0], uffd, addrs, sizeof addrs);
        char c;
        if (read(sv[0], &c, 1) != 1) return 1; /* the parent tried its move */
        long own = move(uffd, scratch, mem, PAGE);
        /* Fact 2: an unmap's event left unread refuses the next move. */
        victim = mem + 3 * PAGE;
        pthread_t t;
        pthread_create(&t, NULL, unmap_one, NULL);
        /* Once the page is unmapped, the munmap waits for its event. */
        unsigned char v;
        while (mincore(victim, PAGE, &v) == 0) sched_yield();
        long pending = move(uffd, scratch + PAGE, mem + PAGE, PAGE);
        struct uffd_msg msg;
        while (read(uffd, &msg, sizeof msg) != sizeof msg) sched_yield();
        pthread_join(t, NULL);
        printf("a move in the descriptor's own process: %s\n", own ? strerror(own) : "moved");
        printf("a move while an unmap event is unread: %s\n", pending ? strerror(pending) : "moved");
        return own == 0 && pending == EAGAIN ? 0 : 3;
    }
    char *addrs[2];
    int uffd = recv_fd(sv[1], addrs, sizeof addrs);
    if (uffd < 0) return 1;
    long remote = move(uffd, addrs[1], addrs[0], PAGE);
    printf("a move from another process: %s\n", remote ? strerror(remote) : "moved");
    if (write(sv[1], "x", 1) != 1) return 1;
    int status;
    waitpid(pid, &status, 0);
    return remote == EINVAL && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2;
}
