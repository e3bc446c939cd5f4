/* One thread drops (MADV_DONTNEED) a block while another forks, over and
 * over. The kernel zaps the block as one step against the fork's copy, so
 * each child must find the block either all as written or all zeros.
 * Prints "ROUNDS rounds, mixed M" (M children found old bytes and zeros
 * together) and exits 1 if M > 0. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#define MIB (1024UL * 1024UL)

static uint64_t *block;
static size_t words;
static atomic_int go;

static void *dropper(void *arg) {
    (void)arg;
    while (!atomic_load(&go)) {}
    if (madvise(block, words * 8, MADV_DONTNEED) != 0) { perror("madvise"); _exit(2); }
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 8;
    words = mib * MIB / 8;
    block = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) { perror("mmap"); return 2; }
    /* Other memory, touched between rounds, pushes the block out. */
    size_t other_words = 4 * words;
    uint64_t *other = malloc(other_words * 8);
    int mixed = 0;
    for (int r = 0; r < rounds; r++) {
        /* Word 0 of each page is never 0: its old value and zero differ. */
        for (size_t i = 0; i < words; i++) block[i] = (i ^ 0x5555) | 1;
        for (size_t i = 0; i < other_words; i += 512) other[i] = i + r;
        /* Its second half back in: the drop takes resident and swapped
         * memory together. */
        uint64_t sum = 0;
        for (size_t i = words / 2; i < words; i += 512) sum += block[i];
        if (sum == 0) { printf("block lost\n"); return 2; }
        atomic_store(&go, 0);
        pthread_t t;
        pthread_create(&t, NULL, dropper, NULL);
        atomic_store(&go, 1);
        for (volatile int spin = 0; spin < (r % 10) * 300; spin++) {}
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) {
            size_t old = 0, zero = 0;
            for (size_t i = 0; i < words; i++) {
                if (block[i] == ((i ^ 0x5555) | 1)) old++;
                else if (block[i] == 0) zero++;
            }
            _exit(old == words ? 0 : zero == words ? 1 : 3);
        }
        pthread_join(t, NULL);
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) { printf("child died\n"); return 2; }
        if (WEXITSTATUS(st) == 3) mixed++;
    }
    printf("%d rounds, mixed %d\n", rounds, mixed);
    return mixed > 0;
}
