/* Fills MIB MiB (argument) with words that name their page, says so, and
 * aborts: a death with a core dump. Every word of page i is
 * i ^ CORE_MARK, so that a core file shows which of the pages it holds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#define CORE_MARK 0x5157415043524553ull

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? strtoul(argv[1], 0, 0) : 64) << 20;
    uint64_t *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    for (size_t i = 0; i < len / 8; i++) p[i] = (i / 512) ^ CORE_MARK;
    printf("coredump filled %zu pages\n", len / 4096);
    fflush(stdout);
    abort();
}
