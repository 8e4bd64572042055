"""A memory ceiling for a test's child process (issue 42): after its imports, the address space may
grow by at most `extra` bytes more, so code that lists a huge space or reads a huge array fails
there with MemoryError instead of exhausting the machine."""

from __future__ import annotations

import resource


def vm_size() -> int:
    """This process's address space now, in bytes (Linux /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def cap_address_space(extra: int = 1 << 30) -> int:
    """Allow this process `extra` bytes of address space beyond what it holds now; the cap set."""
    cap = vm_size() + extra
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


class memory_ceiling:
    """Within the block, this process's address space may grow by at most `extra` bytes (the soft
    RLIMIT_AS, restored on exit), and Python's allocations are traced: `peak` is their high mark.
    An in-process test that lists a huge space or reads a huge array hits MemoryError instead of
    exhausting the machine, and its peak shows a smaller regression."""

    def __init__(self, extra: int = 1 << 30, trace: bool = True):
        self.extra = extra
        self.trace = trace  # tracing slows a loop of small allocations: off where the ceiling alone decides
        self.peak = 0

    def __enter__(self) -> "memory_ceiling":
        import tracemalloc

        self._soft, self._hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = vm_size() + self.extra
        if self._hard != resource.RLIM_INFINITY:
            cap = min(cap, self._hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, self._hard))
        if self.trace:
            tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        import tracemalloc

        if self.trace:
            self.peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        resource.setrlimit(resource.RLIMIT_AS, (self._soft, self._hard))
