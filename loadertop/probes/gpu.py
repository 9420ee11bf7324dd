"""NVML, behind one narrow boundary.

Every NVML call goes through `GpuProbe._query`, which maps NVML errors to None (a field
this GPU does not support is n/a, never 0). The library is the `pynvml` module of
nvidia-ml-py, imported and initialised lazily on the first sample; tests pass a fake with
the same function names. With no driver or library there are no GPUs and one notice.
"""

from __future__ import annotations

import time
from typing import Any

from .. import notices as N
from ..model import GpuSnapshot, Notice

NO_DRIVER = Notice(
    N.NO_GPU,
    "no NVIDIA driver found; GPU metrics off",
    "install the NVIDIA driver (nvidia-smi must work) to see GPU utilization",
)


def _load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


class GpuProbe:
    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._ready: bool | None = None  # None: not tried yet
        self._notice: Notice | None = None
        self._handles: list[Any] = []
        self._last_sample_us: dict[int, int] = {}

    @property
    def available(self) -> bool:
        return bool(self._ready)

    def _init(self) -> None:
        try:
            if self._lib is None:
                self._lib = _load_pynvml()
            lib = self._lib
            lib.nvmlInit()
            self._handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
            self._ready = True
        except ImportError:
            self._ready = False
            self._notice = Notice(
                N.NO_GPU,
                "nvidia-ml-py is not installed; GPU metrics off",
                "pip install nvidia-ml-py",
            )
        except Exception as e:  # NVMLError and friends: classify by its code
            self._ready = False
            self._notice = self._init_notice(e)

    def _init_notice(self, error: Exception) -> Notice:
        lib = self._lib
        code = getattr(error, "value", None)
        if lib is None or code in (
            getattr(lib, "NVML_ERROR_LIBRARY_NOT_FOUND", object()),
            getattr(lib, "NVML_ERROR_DRIVER_NOT_LOADED", object()),
        ):
            return NO_DRIVER
        if code == getattr(lib, "NVML_ERROR_NO_PERMISSION", object()):
            return Notice(
                N.GPU_PERMISSION,
                "NVML refused access to the GPUs; GPU metrics off",
                "run loadertop as a user allowed to open /dev/nvidia* (the video group, or root)",
            )
        if code == getattr(lib, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", object()):
            return Notice(
                N.GPU_DRIVER_MISMATCH,
                "the NVIDIA driver and its library do not match; GPU metrics off",
                "reboot or reload the nvidia kernel module after the driver upgrade",
            )
        return Notice(N.GPU_ERROR, f"NVML failed to start ({error}); GPU metrics off", None)

    def _query(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._lib, fn)(*args)
        except Exception:
            # NotSupported, NoPermission, GPU lost: the field is n/a for this tick.
            return None

    def sample(self) -> tuple[tuple[GpuSnapshot, ...], tuple[Notice, ...]]:
        if self._ready is None:
            self._init()
        if not self._ready:
            return (), ((self._notice,) if self._notice else ())
        return tuple(self._sample_one(i, h) for i, h in enumerate(self._handles)), ()

    def _sample_one(self, index: int, handle: Any) -> GpuSnapshot:
        q = self._query
        lib = self._lib
        util = q("nvmlDeviceGetUtilizationRates", handle)
        mem = q("nvmlDeviceGetMemoryInfo", handle)
        power = q("nvmlDeviceGetPowerUsage", handle)
        limit = q("nvmlDeviceGetEnforcedPowerLimit", handle)
        tx = q("nvmlDeviceGetPcieThroughput", handle, getattr(lib, "NVML_PCIE_UTIL_TX_BYTES", 0))
        rx = q("nvmlDeviceGetPcieThroughput", handle, getattr(lib, "NVML_PCIE_UTIL_RX_BYTES", 1))
        pids: set[int] = set()
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in q(fn, handle) or ():
                pids.add(int(proc.pid))
        name = q("nvmlDeviceGetName", handle)
        uuid = q("nvmlDeviceGetUUID", handle)
        return GpuSnapshot(
            index=index,
            uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
            name=name.decode() if isinstance(name, bytes) else name,
            utilization_percent=float(util.gpu) if util is not None else None,
            memory_utilization_percent=float(util.memory) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            sm_clock_mhz=q("nvmlDeviceGetClockInfo", handle, getattr(lib, "NVML_CLOCK_SM", 1)),
            pcie_tx_bytes_per_s=tx * 1024.0 if tx is not None else None,
            pcie_rx_bytes_per_s=rx * 1024.0 if rx is not None else None,
            process_pids=tuple(sorted(pids)),
        )

    def process_utilization(self, index: int) -> dict[int, float]:
        """pid -> SM utilization % since the last call, where the driver keeps samples."""
        if not self._ready:
            return {}
        handle = self._handles[index]
        since = self._last_sample_us.get(index, int((time.time() - 2) * 1e6))
        samples = self._query("nvmlDeviceGetProcessUtilization", handle, since) or ()
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = max(out.get(int(s.pid), 0.0), float(s.smUtil))
            self._last_sample_us[index] = max(self._last_sample_us.get(index, 0), int(s.timeStamp))
        return out

    def close(self) -> None:
        if self._ready:
            self._query("nvmlShutdown")
            self._ready = None
