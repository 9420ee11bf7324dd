"""Every threshold the rules use, in one place, each with the field reference it rests on.

These are starting points tuned on the benchmarks in docs/BENCHMARKS.md, not limits.
"""

# Data wait as a share of the trainer's wall time. TensorFlow's input-pipeline analyzer calls
# >= 5% of step time "moderately" and >= 20% "highly" input-bound; PyTorch's profiler plugin
# flags DataLoader time above 5% of step time.
DATA_WAIT_WARNING = 0.05
DATA_WAIT_CRITICAL = 0.20
# Less than this much evidence (py-spy samples) is noise at 10 Hz (±5 pts needs ~100).
MIN_STACK_SAMPLES = 40
# A sampled share must clear a threshold by this many standard errors (one-sided 95%) to count: a healthy
# loop at 5% +- 2% must not be called input-bound.
CONFIDENCE_Z = 1.64

# A worker above this share of one core is CPU-bound (it computes, it does not wait on I/O);
# below IO_BOUND_CPU it mostly sleeps (disk, network, a remote store).
WORKER_CPU_BOUND = 80.0
WORKER_IO_BOUND = 50.0
# Share of each worker's stack dumps over the window that must show "waiting for indices" to
# call the loader ahead of the loop. A worker that is behind always has prefetched indices
# queued and shows it ~never; one that is ahead shows it all but its busy share (~75% for a
# worker handing many tensors over). A third keeps a few unlucky dumps from deciding.
LOADER_AHEAD_SHARE = 0.34
# I/O-bound loaders may run more workers than cores; cap the suggestion at this many per CPU.
IO_WORKERS_PER_CPU = 4
# Another CPU-bound worker is worth suggesting where it would get at least this share of a
# CPU (idle CPUs, and the trainer's share left beside its main process, are rounded so): half
# a CPU more for the loader is half as many batches again.
WORKER_MIN_CPU = 0.5

# Busy threads are counted by probes/procs (BUSY_THREAD_MIN_CPU, BUSY_THREAD_OF_BUSIEST); a
# healthy worker has one busy thread (its main thread) beside ~2 idle queue feeder threads.
WORKER_BUSY_THREADS = 1.5  # mean busy threads per worker above which pools are running

# Oversubscription: run-queue wait (seconds runnable but not running, per second, summed over
# the trainer's processes) and load average against usable CPUs.
RUNQUEUE_WAIT_WARNING = 0.5
LOAD_PER_CPU_WARNING = 1.25

# Several loaders share the machine: torch warns when num_workers exceeds usable CPUs;
# Lightning suggests max(1, usable_cpus // local_world_size - 1) workers per process.
HOST_BUSY_PERCENT = 85.0

# /dev/shm: Docker's default is 64 MB and a full /dev/shm shows as "Bus error" or a hang.
SHM_WARNING = 0.80
SHM_CRITICAL = 0.95

# Copy-on-read: worker USS/PSS growing while RSS stays flat.
MEMORY_GROWTH_MIN_WINDOW_S = 20.0
MEMORY_GROWTH_MIN_BYTES_PER_MIN = 4 * 2**20  # per worker
MEMORY_GROWTH_MIN_FIT = 0.8  # R² of a straight line through the samples
MEMORY_GROWTH_CRITICAL_HOURS = 1.0

# Worker churn: this many re-creations within the window mean an epoch-by-epoch respawn.
RESPAWN_MIN = 2
RESPAWN_WINDOW_S = 300.0

# A hang: the main thread continuously in data wait this long while every worker is idle.
STALL_S = 20.0
IDLE_WORKER_CPU = 2.0

# Hysteresis: a condition must hold this long to raise a finding, and be gone this long to
# clear it, so findings do not flap tick to tick.
HOLD_S = 10.0
CLEAR_S = 20.0
