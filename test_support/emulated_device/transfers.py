"""What :meth:`~test_support.emulated_device.EmulatedDevice.counting` counts: transfers
by kind, the bytes the host reads, and device operations by name."""

from __future__ import annotations

import collections

from test_support.emulated_device.ops import NO_LAUNCH, UNCLASSIFIED

# A device->host copy into pinned memory with non_blocking: queued, not waited for.
ASYNC_D2H = "async d2h into pinned memory"
# The host waits on an event (:class:`~.device._Event`): for the work queued before it only.
EVENT_WAIT = "wait on an event"


class Transfers:
    """Counts, by kind, the transfers made while :meth:`EmulatedDevice.counting` is active.

    Kinds: ``h2d blocking`` / ``h2d non_blocking`` (explicit copies to the device),
    ``h2d hidden`` (``torch.tensor(values, device=device)``: built on the host and copied,
    blocking), ``h2d implicit <op>`` (a host tensor of more than one element mixed into a
    device operation), ``d2h <kind>`` (a device value read on the host).
    """

    def __init__(self) -> None:
        self.kinds: collections.Counter[str] = collections.Counter()
        self.where: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
        self.read_bytes = 0  # what the host reads, copied or converted
        self.ops: collections.Counter[str] = collections.Counter()  # device ops, by name

    def add(self, kind: str, detail: str = "", nbytes: int = 0) -> None:
        self.kinds[kind] += 1
        self.read_bytes += nbytes
        if detail and len(self.where[kind]) < 8:
            self.where[kind].append(detail)

    @property
    def blocking_copies(self) -> int:
        """Host->device copies that block the host."""
        return sum(
            n for kind, n in self.kinds.items() if kind.startswith("h2d") and "non_" not in kind
        )

    @property
    def device_reads(self) -> int:
        """Device values read on the host, each a stream synchronize."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith("d2h"))

    @property
    def unclassified(self) -> list[str]:
        """Device operations the emulation does not know (:data:`.ops._FREE`): the level fails
        until each is classified from PyTorch's CUDA sources."""
        return sorted(kind for kind in self.kinds if kind.startswith(UNCLASSIFIED))

    @property
    def event_waits(self) -> int:
        """Waits for an event recorded earlier (a copy started before the step)."""
        return self.kinds[EVENT_WAIT]

    def summary(self) -> str:
        return ", ".join(f"{kind} x{count}" for kind, count in sorted(self.kinds.items()))

    @property
    def launches(self) -> int:
        """Device operations that run a kernel (views, allocations and metadata do not):
        on a GPU each is a launch, ~5-10 us of host time with the Python around it."""
        return sum(n for name, n in self.ops.items() if name not in NO_LAUNCH)
