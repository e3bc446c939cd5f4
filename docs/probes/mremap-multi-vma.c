/*
 * Checks what the kernel does with an mremap move (MREMAP_FIXED, same
 * length) of a range that spans several mappings, with and without
 * userfaultfd registration. Linux 6.17 and later move such a range in one
 * call, but refuse (EFAULT) when any mapping in it is registered with a
 * userfaultfd; a move inside one mapping is never refused for that.
 *
 *   cc -O2 -o mremap-multi-vma docs/probes/mremap-multi-vma.c && ./mremap-multi-vma
 *
 * On Linux 6.18 it prints "moved" for every case except: registered whole
 * and split in three by mprotect, and registered in its first half only
 * (split or not): "Bad address".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096L
#define PAGES 8

/* Moves PAGES pages, registered not at all (0), whole (1) or in their first
 * half (2), split by an mprotect of one page or not; returns 0 or errno. */
static int move(int registered, int split) {
	char *from = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *to = mmap(0, PAGES * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (from == MAP_FAILED || to == MAP_FAILED) return errno;
	memset(from, 1, PAGES * PAGE);
	if (split && mprotect(from + 2 * PAGE, PAGE, PROT_READ)) return errno;
	int fd = -1;
	if (registered) {
		fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		struct uffdio_api api = {.api = UFFD_API};
		struct uffdio_register reg = {
			.range = {(unsigned long)from, (registered == 2 ? PAGES / 2 : PAGES) * PAGE},
			.mode = UFFDIO_REGISTER_MODE_MISSING,
		};
		if (fd < 0 || ioctl(fd, UFFDIO_API, &api) || ioctl(fd, UFFDIO_REGISTER, &reg)) {
			perror("userfaultfd");
			return -1;
		}
	}
	int err = mremap(from, PAGES * PAGE, PAGES * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED ? errno : 0;
	if (fd >= 0) close(fd);
	return err;
}

int main(void) {
	const char *how[] = {"not registered", "registered whole", "registered in half"};
	for (int registered = 0; registered < 3; registered++)
		for (int split = 0; split < 2; split++) {
			int err = move(registered, split);
			printf("%-20s %-26s %s\n", how[registered], split ? "split by mprotect:" : "one mapping:",
			       err ? strerror(err) : "moved");
		}
	return 0;
}
