/* A program that does to its memory what real programs do, and prints
 * checksums of everything it wrote: run under `uswap run` with a quarter of
 * its working set, its output must be the same as without.
 *
 * malloc/calloc/realloc/free of small and huge blocks, mmap/munmap/mremap/
 * mprotect, threads, fork (the child verifies and modifies its copy), exec.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

/* Fills with a pattern that compresses a little, like real data. */
static void fill(void *p, size_t len, uint64_t seed) {
    uint64_t *w = p;
    for (size_t i = 0; i < len / 8; i++)
        w[i] = (i % 7 == 0) ? mix(seed + i) : (seed + i / 64);
}

static uint64_t sum(const void *p, size_t len) {
    const uint64_t *w = p;
    uint64_t h = len;
    for (size_t i = 0; i < len / 8; i++)
        h = mix(h ^ w[i]) + i;
    return h;
}

static int check(const void *p, size_t len, uint64_t seed) {
    const uint64_t *w = p;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != ((i % 7 == 0) ? mix(seed + i) : (seed + i / 64)))
            return 0;
    return 1;
}

#define SMALL 60000
static char *small[SMALL];
static size_t small_len[SMALL];

struct job { uint64_t seed; uint64_t result; };

static void *worker(void *arg) {
    struct job *j = arg;
    size_t len = 6 * MIB;
    char *p = malloc(len);
    fill(p, len, j->seed);
    char *q = malloc(len);
    fill(q, len, j->seed + 1);
    j->result = sum(p, len) ^ sum(q, len) ^ (uint64_t)check(p, len, j->seed);
    free(p);
    free(q);
    return NULL;
}

static int exec_child(void) {
    size_t len = 24 * MIB;
    char *p = malloc(len);
    fill(p, len, 77);
    char *q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill(q, len, 78);
    printf("exec child: %d %d %016llx\n", check(p, len, 77), check(q, len, 78),
           (unsigned long long)(sum(p, len) ^ sum(q, len)));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0)
        return exec_child();
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* Small blocks: malloc, realloc some, free some. */
    uint64_t h = 0;
    for (int i = 0; i < SMALL; i++) {
        small_len[i] = 64 + (mix(i) % 400) * 8;
        small[i] = malloc(small_len[i]);
        fill(small[i], small_len[i], i);
    }
    for (int i = 0; i < SMALL; i += 3) {
        small_len[i] *= 2;
        small[i] = realloc(small[i], small_len[i]);
        fill(small[i] + small_len[i] / 2, small_len[i] / 2, i + 1000000);
    }
    for (int i = 1; i < SMALL; i += 5) {
        free(small[i]);
        small[i] = NULL;
    }
    /* Huge blocks (glibc maps these on their own) and calloc. */
    size_t huge_len = 16 * MIB;
    char *huge = malloc(huge_len);
    fill(huge, huge_len, 5);
    char *zeroed = calloc(8, 2 * MIB);
    fill(zeroed + 4 * MIB, 4 * MIB, 6);
    char *grown = malloc(4 * MIB);
    fill(grown, 4 * MIB, 7);
    grown = realloc(grown, 20 * MIB);
    fill(grown + 4 * MIB, 16 * MIB, 8);

    /* Plain mappings: mprotect a middle part, munmap a hole, mremap. */
    size_t map_len = 24 * MIB;
    char *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill(map, map_len, 9);
    mprotect(map + 4 * MIB + 4096, 8192, PROT_READ);
    h ^= sum(map, map_len);
    mprotect(map + 4 * MIB + 4096, 8192, PROT_READ | PROT_WRITE);
    munmap(map + 12 * MIB, 4 * MIB);
    uint64_t before_move = sum(map + 16 * MIB, 8 * MIB);
    char *moved = mremap(map + 16 * MIB, 8 * MIB, 12 * MIB, MREMAP_MAYMOVE);
    fill(moved + 8 * MIB, 4 * MIB, 10);

    /* Threads. */
    pthread_t t[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].seed = 100 + i;
        pthread_create(&t[i], NULL, worker, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        h ^= jobs[i].result;
    }

    /* Everything written so far, checked and summed. */
    int ok = 1;
    for (int i = 0; i < SMALL; i++) {
        if (!small[i]) continue;
        if (i % 3 == 0)
            ok &= check(small[i] + small_len[i] / 2, small_len[i] / 2, i + 1000000);
        else
            ok &= check(small[i], small_len[i], i);
        h ^= sum(small[i], small_len[i]);
    }
    ok &= check(huge, huge_len, 5) && check(grown, 4 * MIB, 7) && check(grown + 4 * MIB, 16 * MIB, 8);
    ok &= check(map, 12 * MIB, 9) && sum(moved, 8 * MIB) == before_move && check(moved + 8 * MIB, 4 * MIB, 10);
    for (size_t i = 0; i < 4 * MIB; i++)
        if (zeroed[i]) { ok = 0; break; }
    ok &= check(zeroed + 4 * MIB, 4 * MIB, 6);
    h ^= sum(huge, huge_len) ^ sum(zeroed, 16 * MIB) ^ sum(grown, 20 * MIB) ^ sum(map, 12 * MIB) ^ sum(moved, 12 * MIB);
    printf("parent before fork: ok=%d %016llx\n", ok, (unsigned long long)h);

    /* fork: the child verifies its copy, changes it, and reports. */
    pid_t pid = fork();
    if (pid == 0) {
        int cok = check(huge, huge_len, 5) && check(map, 12 * MIB, 9) && check(moved + 8 * MIB, 4 * MIB, 10);
        for (int i = 2; i < SMALL; i += 5)
            cok &= (i % 3 == 0) ? check(small[i] + small_len[i] / 2, small_len[i] / 2, i + 1000000)
                                : check(small[i], small_len[i], i);
        fill(huge, huge_len, 55);
        fill(map, 12 * MIB, 56);
        printf("child: ok=%d %016llx\n", cok, (unsigned long long)(sum(huge, huge_len) ^ sum(map, 12 * MIB)));
        _exit(cok ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    /* The parent's copy is untouched by the child's writes. */
    printf("parent after fork: ok=%d\n", check(huge, huge_len, 5) && check(map, 12 * MIB, 9));

    /* exec: a new image, managed from the start. */
    pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "exec-child", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    printf("exec child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));

    for (int i = 0; i < SMALL; i++) free(small[i]);
    free(huge);
    free(zeroed);
    free(grown);
    munmap(map, 12 * MIB);
    munmap(moved, 12 * MIB);
    printf("done\n");
    return 0;
}
