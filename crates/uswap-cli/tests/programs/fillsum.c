/* Fills MIB MiB (argument) with a pattern, reads it back, and prints
 * "fillsum N" with its sum: a program to run with and without the agent
 * (the tests build it statically linked too, which ignores LD_PRELOAD). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? strtoul(argv[1], 0, 0) : 64) << 20;
    uint64_t *p = malloc(len);
    if (!p) return 2;
    for (size_t i = 0; i < len / 8; i++) p[i] = i * 7;
    uint64_t sum = 0;
    for (size_t i = 0; i < len / 8; i++) sum += p[i];
    printf("fillsum %llu\n", (unsigned long long)sum);
    return 0;
}
