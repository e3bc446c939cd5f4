/* Fills 64 MiB, says "ready PID" once, then checks it over and over,
 * printing WRONG on any mismatch: for killing its supervisor under it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void) {
    size_t words = 64UL * 1024 * 1024 / 8;
    uint64_t *p = malloc(words * 8);
    for (size_t i = 0; i < words; i++) p[i] = i * 2654435761u;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (unsigned pass = 0;; pass++) {
        for (size_t i = 0; i < words; i++)
            if (p[i] != i * 2654435761u) {
                printf("WRONG at %zu in pass %u\n", i, pass);
                return 1;
            }
        if (pass == 0) printf("ready %d\n", (int)getpid());
    }
}
