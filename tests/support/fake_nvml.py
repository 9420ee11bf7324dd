"""A fake of nvidia-ml-py's `pynvml` at the one boundary loadertop uses (probes/gpu.py),
scripted from realistic values of an H100 in training. No GPU exists on these machines."""

from __future__ import annotations

from types import SimpleNamespace

NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_SM = 1


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """One or more GPUs. `utilization` is a list played one value per sample (the last
    repeats); `unsupported` names functions that raise NotSupported; `processes` are the
    pids NVML reports on GPU 0 (host pids, or pids inside a container)."""

    def __init__(self, gpus: int = 1, utilization=(97.0,), processes=(), unsupported=(), init_error=None):
        self.gpus = gpus
        self.utilization = list(utilization)
        self.processes = list(processes)
        self.unsupported = set(unsupported)
        self.init_error = init_error
        self.samples = 0
        self.shut_down = False

    def __getattr__(self, name):  # constants like the module's
        value = globals().get(name)
        if value is None:
            raise AttributeError(name)
        return value

    def _check(self, fn: str) -> None:
        if fn in self.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000-{h[1]}"

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check("nvmlDeviceGetUtilizationRates")
        value = self.utilization[min(self.samples, len(self.utilization) - 1)] if h[1] == 0 else 0.0
        if h[1] == 0:
            self.samples += 1
        return SimpleNamespace(gpu=value, memory=value / 2)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=30 * 2**30, total=80 * 2**30, free=50 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        self._check("nvmlDeviceGetPowerUsage")
        return 412_000  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._check("nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._check("nvmlDeviceGetPcieThroughput")
        return 1_500_000 if counter == NVML_PCIE_UTIL_RX_BYTES else 200_000  # KB/s

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=10 * 2**30) for p in self.processes] if h[1] == 0 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlDeviceGetProcessUtilization(self, h, since):
        self._check("nvmlDeviceGetProcessUtilization")
        return [SimpleNamespace(pid=p, smUtil=40, timeStamp=since + 1) for p in self.processes]
