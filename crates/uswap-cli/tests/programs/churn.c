/* A program that keeps changing the layout of its memory from several
 * threads while it works with more than its limit, and checks every byte
 * against what it wrote: run under `uswap run`, it must end with
 * "churn ok".
 *
 * Each thread owns blocks of four 64 KiB pieces. At random it checks a
 * block, rewrites it, unmaps it and maps a new one (the kernel tends to
 * hand out the same address again, to this thread or another), unmaps one
 * piece and maps new memory at exactly that address, drops a piece
 * (MADV_DONTNEED: it must read zeros), makes a piece read-only and checks
 * it, marks a piece MADV_WIPEONFORK or unmarks it (a child gets a marked
 * piece empty), or forks a child that checks the thread's blocks in its
 * copy; with
 * MOVES 1, it also moves blocks onto others of its own (mremap, piece by
 * piece, as glibc's realloc moves a large block). What it models: each
 * piece's generation (0: zeros), unique to its thread, which is what its
 * words are made of, and whether it is marked.
 *
 *   churn [THREADS] [BLOCKS_PER_THREAD] [OPS_PER_THREAD] [SEED] [MOVES]
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

#define PIECE (64UL << 10)
#define PIECES 4
#define BLOCK (PIECES * PIECE)

struct block {
    char *base;                 /* NULL: not mapped */
    uint64_t gen[PIECES];       /* 0: the piece reads zeros */
    int wiped[PIECES];          /* marked MADV_WIPEONFORK */
    long op[PIECES];            /* the operation that last changed it */
    const char *how[PIECES];    /* and what it did */
};

struct thread {
    int id;
    int blocks;
    long ops;
    uint64_t rng;
    uint64_t next_gen;
    long op;                    /* the operation under way */
    struct block *b;
    pthread_t t;
    int bad;
};

static uint64_t seed;
static int moves;

static uint64_t next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

static uint64_t word(int tid, uint64_t gen, size_t i) {
    uint64_t x = seed ^ ((uint64_t)tid << 48) ^ gen;
    x *= 0x9e3779b97f4a7c15ULL;
    /* Half repeats, half varies: it compresses somewhat, like real data. */
    return (i & 1) ? x : x + i;
}

static void changed(struct thread *t, int blk, int piece, const char *how) {
    t->b[blk].op[piece] = t->op;
    t->b[blk].how[piece] = how;
}

static void fill_piece(struct thread *t, int blk, int piece) {
    uint64_t *w = (uint64_t *)(t->b[blk].base + piece * PIECE);
    uint64_t gen = t->b[blk].gen[piece];
    for (size_t i = 0; i < PIECE / 8; i++) w[i] = word(t->id, gen, i);
}

/* 0 if the piece holds what the model says. */
static int check_piece(struct thread *t, int blk, int piece, const char *what) {
    const uint64_t *w = (const uint64_t *)(t->b[blk].base + piece * PIECE);
    uint64_t gen = t->b[blk].gen[piece];
    for (size_t i = 0; i < PIECE / 8; i++) {
        uint64_t want = gen ? word(t->id, gen, i) : 0;
        if (w[i] != want) {
            size_t wrong = 0, last = i;
            for (size_t j = i; j < PIECE / 8; j++)
                if (w[j] != (gen ? word(t->id, gen, j) : 0)) wrong++, last = j;
            printf("churn BAD: thread %d block %d piece %d word %zu at %p (%s, pid %d): %#llx, want %#llx (gen %llu); "
                   "%zu words wrong up to word %zu; the piece last changed at operation %ld (%s), now %ld\n",
                   t->id, blk, piece, i, (void *)&w[i], what, (int)getpid(), (unsigned long long)w[i],
                   (unsigned long long)want, (unsigned long long)gen, wrong, last, t->b[blk].op[piece],
                   t->b[blk].how[piece] ? t->b[blk].how[piece] : "?", t->op);
            return 1;
        }
    }
    return 0;
}

static int check_block(struct thread *t, int blk, const char *what) {
    if (!t->b[blk].base) return 0;
    for (int p = 0; p < PIECES; p++)
        if (check_piece(t, blk, p, what)) return 1;
    return 0;
}

static void *map_anywhere(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("churn: mmap"); exit(2); }
    return p;
}

static void new_block(struct thread *t, int blk) {
    t->b[blk].base = map_anywhere(BLOCK);
    for (int p = 0; p < PIECES; p++) {
        t->b[blk].gen[p] = ++t->next_gen;
        t->b[blk].wiped[p] = 0;
        fill_piece(t, blk, p);
        changed(t, blk, p, "a new block");
    }
}

static void *work(void *arg) {
    struct thread *t = arg;
    for (int k = 0; k < t->blocks; k++) new_block(t, k);
    for (long n = 0; n < t->ops && !t->bad; n++) {
        t->op = n;
        int blk = next(&t->rng) % t->blocks;
        int piece = next(&t->rng) % PIECES;
        struct block *b = &t->b[blk];
        char *at = b->base + piece * PIECE;
        switch (next(&t->rng) % (moves ? 18 : 16)) {
        case 0: case 1: case 2: case 3: case 4:
            t->bad |= check_block(t, blk, "check");
            break;
        case 5: case 6:
            b->gen[piece] = ++t->next_gen;
            fill_piece(t, blk, piece);
            changed(t, blk, piece, "rewritten");
            break;
        case 7: case 8:
            /* A new block, most likely where an old one was. */
            t->bad |= check_block(t, blk, "before unmap");
            munmap(b->base, BLOCK);
            new_block(t, blk);
            break;
        case 9: case 10: {
            /* New memory at exactly the address of a piece just unmapped. */
            munmap(at, PIECE);
            void *p = mmap(at, PIECE, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == at) {
                b->gen[piece] = ++t->next_gen;
                b->wiped[piece] = 0;
                fill_piece(t, blk, piece);
                changed(t, blk, piece, "new memory in its place");
                break;
            }
            /* Another thread took the address first: the block goes. */
            if (p != MAP_FAILED) munmap(p, PIECE);
            for (int q = 0; q < PIECES; q++)
                if (q != piece) munmap(b->base + q * PIECE, PIECE);
            new_block(t, blk);
            break;
        }
        case 11:
            if (madvise(at, PIECE, MADV_DONTNEED)) { perror("churn: madvise"); exit(2); }
            b->gen[piece] = 0;
            changed(t, blk, piece, "dropped");
            break;
        case 12: case 13:
            if (mprotect(at, PIECE, PROT_READ)) { perror("churn: mprotect"); exit(2); }
            t->bad |= check_piece(t, blk, piece, "read-only");
            if (mprotect(at, PIECE, PROT_READ | PROT_WRITE)) { perror("churn: mprotect"); exit(2); }
            break;
        case 14: {
            pid_t pid = fork();
            if (pid < 0) { perror("churn: fork"); exit(2); }
            if (pid == 0) {
                int bad = 0;
                /* The child's own copy of the model: marked pieces came
                 * empty. */
                for (int k = 0; k < t->blocks; k++)
                    for (int q = 0; q < PIECES; q++)
                        if (t->b[k].base && t->b[k].wiped[q]) t->b[k].gen[q] = 0;
                for (int k = 0; k < t->blocks && !bad; k++) bad |= check_block(t, k, "in a forked child");
                fflush(stdout);
                _exit(bad);
            }
            int status;
            if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
                /* Whether the parent's own copy is right too tells a
                 * child's inheritance from a loss in the parent. */
                for (int k = 0; k < t->blocks; k++) check_block(t, k, "in the parent after its child failed");
                t->bad = 1;
            }
            break;
        }
        case 15: {
            int mark = !b->wiped[piece];
            if (madvise(at, PIECE, mark ? MADV_WIPEONFORK : MADV_KEEPONFORK)) {
                perror("churn: madvise");
                exit(2);
            }
            b->wiped[piece] = mark;
            changed(t, blk, piece, mark ? "marked wipe-on-fork" : "unmarked");
            break;
        }
        case 16: case 17: {
            /* The block moves onto another block of this thread, whose
             * memory goes; a new block takes its place. */
            int to = next(&t->rng) % t->blocks;
            struct block *d = &t->b[to];
            if (to == blk) break;
            t->bad |= check_block(t, blk, "before a move");
            for (int q = 0; q < PIECES; q++) {
                if (mremap(b->base + q * PIECE, PIECE, PIECE, MREMAP_MAYMOVE | MREMAP_FIXED,
                           d->base + q * PIECE) == MAP_FAILED) {
                    perror("churn: mremap");
                    exit(2);
                }
                d->gen[q] = b->gen[q];
                d->wiped[q] = b->wiped[q];
                changed(t, to, q, "moved here");
            }
            new_block(t, blk);
            break;
        }
        default:
            t->bad |= check_piece(t, blk, piece, "check piece");
            break;
        }
    }
    for (int k = 0; k < t->blocks && !t->bad; k++) t->bad |= check_block(t, k, "at the end");
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int threads = argc > 1 ? atoi(argv[1]) : 3;
    int blocks = argc > 2 ? atoi(argv[2]) : 32;
    long ops = argc > 3 ? atol(argv[3]) : 3000;
    seed = argc > 4 ? strtoull(argv[4], NULL, 0) : 1;
    moves = argc > 5 ? atoi(argv[5]) : 0;
    struct thread *t = calloc(threads, sizeof *t);
    for (int i = 0; i < threads; i++) {
        t[i] = (struct thread){.id = i, .blocks = blocks, .ops = ops,
                               .rng = seed * 2654435761ULL + i + 1};
        t[i].b = calloc(blocks, sizeof *t[i].b);
        pthread_create(&t[i].t, NULL, work, &t[i]);
    }
    int bad = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i].t, NULL);
        bad |= t[i].bad;
    }
    printf(bad ? "churn BAD\n" : "churn ok\n");
    return bad;
}
