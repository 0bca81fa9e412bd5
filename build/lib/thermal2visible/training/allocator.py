"""Keep freed memory in the training process for the next step (train.keep_freed_memory; glibc's malloc only).

A training step allocates and frees the same activations, gradients and autocast's weight copies every step: about
a gigabyte at 256 px. glibc serves blocks above its mmap threshold (128 KiB, raised by frees to 32 MiB at most)
straight from the kernel and unmaps them when freed, and hands the heap's free top back above its trim threshold, so
by default the kernel faults in and zero-fills most of that memory again in every step. With mmap off and trimming
off, the heap grows to the step's peak once and every later step reuses it. The settings hold for the rest of the
process and are inherited by its forked children.
"""

import ctypes
import platform

# mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: its largest, 2 GiB of free heap top


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve every block from the heap and never shrink it; False where malloc is not glibc's
    (macOS, musl), which is left as it is."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
