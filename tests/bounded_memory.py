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
