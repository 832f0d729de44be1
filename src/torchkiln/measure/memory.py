"""Memory a region of code adds: CUDA peaks (allocated and reserved: reserved includes the
private pools of CUDA graphs) above what was held on entry, and on the CPU the peak resident
set sampled by a thread."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass


def _rss_bytes() -> int:
    # /proc/self/statm: resident pages in the second field; Linux only, which is where kiln runs.
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class MemoryReport:
    device: str
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    rss_start_bytes: int | None = None
    allocated_at_entry_bytes: int | None = None
    reserved_at_entry_bytes: int | None = None

    @property
    def peak_rss_delta_bytes(self) -> int | None:
        if self.peak_rss_bytes is None or self.rss_start_bytes is None:
            return None
        return self.peak_rss_bytes - self.rss_start_bytes

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_rss_delta_bytes": self.peak_rss_delta_bytes,
            "allocated_at_entry_bytes": self.allocated_at_entry_bytes,
            "reserved_at_entry_bytes": self.reserved_at_entry_bytes,
        }


class MemoryTracker:
    """Context manager measuring peak memory over a region.

    CUDA: the caching allocator's peak allocated and reserved bytes since entry, less what was
    allocated and reserved on entry (a trial's first baseline instance is already on the device
    when the variant is built; its weights are not the variant's memory). Cached free blocks are
    released on entry so that the reserved figure counts segments the region really added. Every
    device:
    the peak resident set of the process, sampled every ``interval_s`` by a background thread
    (the kernel's ru_maxrss is monotonic over the process's life, so it cannot give a region's
    peak)."""

    def __init__(self, device: str = "cpu", interval_s: float = 0.001) -> None:
        self.device = device
        self.interval_s = interval_s
        self.report = MemoryReport(device=device)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_bytes())
            time.sleep(self.interval_s)

    def __enter__(self) -> MemoryTracker:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.report.allocated_at_entry_bytes = int(torch.cuda.memory_allocated(self.device))
            self.report.reserved_at_entry_bytes = int(torch.cuda.memory_reserved(self.device))
        self.report.rss_start_bytes = _rss_bytes()
        self._peak = self.report.rss_start_bytes
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            allocated = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            self.report.peak_allocated_bytes = int(allocated) - self.report.allocated_at_entry_bytes
            self.report.peak_reserved_bytes = int(reserved) - self.report.reserved_at_entry_bytes
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.report.peak_rss_bytes = max(self._peak, _rss_bytes())
