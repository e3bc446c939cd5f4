/* The kernel reading and writing managed memory for the program, most of it
 * stored: write() from it, read() into it at unaligned places (pages part
 * overwritten), O_DIRECT reads into it (the pages pinned while the disk
 * fills them; the pages that take them were faulted in by the read,
 * the newest, while the oldest go out), and another process reading it
 * (process_vm_readv, /proc/PID/mem).
 *
 * kernelio MIB DIR [ROUNDS]: DIR holds the data file (O_DIRECT needs a
 * file system that has it). What the memory should hold is kept in a
 * shared file mapping, which uswap does not manage. Prints a line per case
 * and "kernelio ok" last if every byte read right. /proc/PID/mem reads of
 * stored pages may fail (the kernel does not wait for a userfaultfd on a
 * remote access): counted, never wrong bytes.
 *
 * ROUNDS (default 0) adds O_DIRECT reads, ROUNDS times, into memory in
 * place (the first 16 MiB, touched first: the oldest) while other
 * threads' new memory makes the reclaimer take it. A read that pins its
 * pages before the reclaimer write-protects and copies them, with the
 * disk writing them after the copy and the pin gone by the move out, left
 * the stored copy the old one until moves were checked against it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#define MIB (1024UL * 1024UL)
#define PAGE 4096UL
#define CHUNK (64 * 1024UL)

static size_t len;
static unsigned char *mem;  /* managed */
static unsigned char *want; /* a shared file mapping: not managed */

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The bytes of version `salt` at [off, off + n): each 8-byte word its own
 * offset and two bytes of noise, so that it compresses. */
static void version(unsigned char *to, size_t off, size_t n, uint64_t salt) {
    size_t first = off & ~7UL;
    for (size_t w = first; w < off + n; w += 8) {
        uint64_t v = (w << 16) | (mix(w ^ salt) & 0xffff);
        unsigned char b[8];
        memcpy(b, &v, 8);
        for (size_t k = 0; k < 8; k++)
            if (w + k >= off && w + k < off + n) to[w + k - off] = b[k];
    }
}

static int check(const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < len; i += PAGE)
        if (memcmp(mem + i, want + i, PAGE)) {
            if (!bad) first = i / PAGE;
            bad++;
        }
    if (bad)
        printf("%s WRONG: %zu pages, the first page %zu\n", what, bad, first);
    else
        printf("%s ok\n", what);
    return bad != 0;
}

struct reads {
    int fd;
    size_t from, to;
    int err;
};

static void *direct_reads(void *arg) {
    struct reads *r = arg;
    for (size_t off = r->from; off < r->to; off += CHUNK)
        if (pread(r->fd, mem + off, CHUNK, off) != (ssize_t)CHUNK) {
            r->err = errno ? errno : EIO;
            return NULL;
        }
    return NULL;
}

/* New memory written over and over: the reclaimer takes the oldest. */
static void *new_memory(void *arg) {
    size_t n = 32 * MIB;
    volatile unsigned char *p = malloc(n);
    for (int pass = 0; p && pass < 4; pass++)
        for (size_t i = 0; i < n; i += PAGE) p[i] = pass;
    free((void *)p);
    return arg;
}

/* O_DIRECT reads of [0, part) into `mem` from two threads; with `stir`,
 * two more write new memory meanwhile. */
static int direct_read_all(int dfd, size_t part, int stir) {
    pthread_t t[4];
    struct reads r[2] = {{dfd, 0, part / 2, 0}, {dfd, part / 2, part, 0}};
    pthread_create(&t[0], 0, direct_reads, &r[0]);
    pthread_create(&t[1], 0, direct_reads, &r[1]);
    for (int i = 2; stir && i < 4; i++) pthread_create(&t[i], 0, new_memory, 0);
    for (int i = 0; i < (stir ? 4 : 2); i++) pthread_join(t[i], 0);
    int err = r[0].err ? r[0].err : r[1].err;
    if (err) printf("O_DIRECT read failed: %s\n", strerror(err));
    return err != 0;
}

static void put(int fd, size_t part, uint64_t salt) {
    version(want, 0, part, salt);
    if (pwrite(fd, want, part, 0) != (ssize_t)part || fdatasync(fd)) {
        perror("writing the data file");
        exit(2);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: kernelio MIB DIR [ROUNDS]\n");
        return 2;
    }
    len = strtoul(argv[1], 0, 0) * MIB;
    int rounds = argc == 4 ? atoi(argv[3]) : 0;
    char want_path[4096], data_path[4096];
    snprintf(want_path, sizeof want_path, "%s/kernelio-want.%d", argv[2], getpid());
    snprintf(data_path, sizeof data_path, "%s/kernelio-data.%d", argv[2], getpid());
    int wfd = open(want_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    int fd = open(data_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (wfd < 0 || fd < 0 || ftruncate(wfd, len)) {
        perror(argv[2]);
        return 2;
    }
    unlink(want_path);
    want = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, wfd, 0);
    mem = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (want == MAP_FAILED || mem == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    int bad = 0;
    version(mem, 0, len, 1);
    version(want, 0, len, 1);

    /* write() from stored memory, in pieces that end inside pages */
    for (size_t off = 0; off < len;) {
        size_t n = len - off < 3 * MIB + 123 ? len - off : 3 * MIB + 123;
        ssize_t w = write(fd, mem + off, n);
        if (w <= 0) {
            perror("write");
            return 2;
        }
        off += w;
    }
    unsigned char *page = malloc(PAGE);
    size_t wrong = 0;
    for (size_t off = 0; off < len; off += PAGE)
        if (pread(fd, page, PAGE, off) != (ssize_t)PAGE || memcmp(page, want + off, PAGE)) wrong++;
    printf("write from stored memory %s\n", wrong ? "WRONG" : "ok");
    bad |= wrong != 0;

    /* read() into stored memory at unaligned places, a few pages at most */
    put(fd, len, 2);
    version(want, 0, len, 1);
    uint64_t x = 12345;
    for (int k = 0; k < 400; k++) {
        x = mix(x + k);
        size_t off = x % (len - 3 * PAGE);
        size_t n = 1 + (x >> 40) % (2 * PAGE + 100);
        if (pread(fd, mem + off, n, off) != (ssize_t)n) {
            perror("pread");
            return 2;
        }
        version(want + off, off, n, 2);
    }
    bad |= check("read into stored memory");

    /* O_DIRECT reads into stored memory; then (ROUNDS) into memory in
     * place that the reclaimer is taking, the data new each round */
    int dfd = open(data_path, O_RDONLY | O_DIRECT);
    if (dfd < 0) {
        printf("O_DIRECT unsupported in %s (%s)\n", argv[2], strerror(errno));
        bad |= rounds > 0;
    } else {
        put(fd, len, 3);
        bad |= direct_read_all(dfd, len, 0);
        bad |= check("O_DIRECT read into stored memory");
        size_t part = len < 16 * MIB ? len : 16 * MIB;
        size_t lost = 0;
        for (int round = 0; round < rounds; round++) {
            put(fd, part, 10 + round);
            for (size_t i = 0; i < part; i += PAGE) mem[i] = want[i];
            bad |= direct_read_all(dfd, part, 1);
            for (size_t i = 0; i < part; i += PAGE) lost += memcmp(mem + i, want + i, PAGE) != 0;
        }
        if (rounds > 0) {
            printf("O_DIRECT read into memory being reclaimed: %zu pages read wrong in %d rounds\n", lost, rounds);
            bad |= lost > 0;
        }
        close(dfd);
    }

    /* another process reads it, the memory of this one stored meanwhile */
    pid_t self = getpid();
    pid_t child = fork();
    if (child == 0) {
        unsigned char *got = malloc(CHUNK);
        size_t failed = 0, wrong_pages = 0;
        for (size_t off = 0; off < len; off += CHUNK) {
            struct iovec local = {got, CHUNK}, remote = {mem + off, CHUNK};
            if (process_vm_readv(self, &local, 1, &remote, 1, 0) != (ssize_t)CHUNK) failed++;
            else if (memcmp(got, want + off, CHUNK)) wrong_pages++;
        }
        printf("process_vm_readv %s: %zu reads failed, %zu wrong\n",
               failed || wrong_pages ? "WRONG" : "ok", failed, wrong_pages);
        int child_bad = failed || wrong_pages;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/mem", self);
        int mfd = open(path, O_RDONLY);
        size_t eio = 0;
        wrong_pages = failed = 0;
        for (size_t off = 0; mfd >= 0 && off < len; off += PAGE) {
            ssize_t n = pread(mfd, got, PAGE, (off_t)(uintptr_t)(mem + off));
            if (n == (ssize_t)PAGE) wrong_pages += memcmp(got, want + off, PAGE) != 0;
            else if (n < 0 && errno == EIO) eio++;
            else failed++;
        }
        printf("/proc/PID/mem %s: %zu pages failed with EIO, %zu otherwise, %zu wrong\n",
               mfd < 0 || failed || wrong_pages ? "WRONG" : "ok", eio, failed, wrong_pages);
        child_bad |= mfd < 0 || failed || wrong_pages;
        _exit(child_bad);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) bad = 1;
    bad |= check("after the reads of another process");
    unlink(data_path);
    printf(bad ? "kernelio WRONG\n" : "kernelio ok\n");
    return bad;
}
