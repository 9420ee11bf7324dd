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

# GPU utilization this high with some host wait: the wait costs less than it seems, so
# input_bound is one severity lower.
GPU_BUSY_PERCENT = 90.0

# A worker above this share of one core is CPU-bound (it computes, it does not wait on I/O);
# below IO_BOUND_CPU it mostly sleeps (disk, network, a remote store).
WORKER_CPU_BOUND = 80.0
WORKER_IO_BOUND = 50.0
# Share of each worker's stack dumps over the window that must show "waiting for indices" to
# call the loader ahead of the loop. A worker that is behind always has prefetched indices
# queued and shows it ~never; one that is ahead shows it all but its busy share (~75% for a
# worker handing many tensors over). A third keeps a few unlucky dumps from deciding.
LOADER_AHEAD_SHARE = 0.34

# Busy threads are counted by probes/procs (BUSY_THREAD_MIN_CPU, BUSY_THREAD_OF_BUSIEST); a
# healthy worker has one busy thread (its main thread) beside ~2 idle queue feeder threads.
WORKER_BUSY_THREADS = 1.5  # mean busy threads per worker above which pools are running

# Oversubscription: run-queue wait (seconds runnable but not running, throttling included,
# per second, summed over the trainer's processes).
RUNQUEUE_WAIT_WARNING = 0.5
# A quota that ran out in this share of its periods (or more) is critical.
THROTTLED_CRITICAL = 0.5

# Several loaders share the machine: torch warns when num_workers exceeds usable CPUs;
# Lightning suggests max(1, usable_cpus // local_world_size - 1) workers per process.
HOST_BUSY_PERCENT = 85.0

# /dev/shm: Docker's default is 64 MB and a full /dev/shm shows as "Bus error" or a hang.
SHM_WARNING = 0.80
SHM_CRITICAL = 0.95

# Copy-on-read: worker USS/PSS growing while RSS stays flat.
MEMORY_WARMUP_S = 5.0  # a worker's first seconds (imports, caches, arenas) are not a trend
MEMORY_GROWTH_MIN_WINDOW_S = 20.0
MEMORY_GROWTH_MIN_POINTS = 6
MEMORY_GROWTH_MIN_BYTES_PER_MIN = 4 * 2**20  # per worker
MEMORY_GROWTH_MIN_FIT = 0.8  # R² of a straight line through the samples
MEMORY_GROWTH_KEEPS_PACE = 0.5  # later half vs earlier half: warm-up slows down, a leak does not
# RSS growing at this share of USS's pace (or more) is real allocation, not copy-on-read.
RSS_GROWTH_SHARE = 0.5
MEMORY_GROWTH_MATTERS_HOURS = 24.0  # slower growth outlasts a training run: no alarm
MEMORY_GROWTH_CRITICAL_HOURS = 1.0

# Worker churn: this many re-creations within the window mean an epoch-by-epoch respawn.
RESPAWN_MIN = 2
RESPAWN_WINDOW_S = 300.0

# A hang: the main thread continuously in data wait for HANG_MIN_S while every worker is
# stopped, or idle (under IDLE_WORKER_CPU % and IDLE_WORKER_SWITCHES context switches a
# second: nothing wakes it); or for STALL_S while every worker's stack stays on one frame.
HANG_MIN_S = 5.0
# Every worker stopped (SIGSTOP, a debugger): a hang once the loop has waited this long without
# a break (py-spy's 3 s first look is enough).
HANG_STOPPED_MIN_S = 2.0
STALL_S = 20.0
IDLE_WORKER_CPU = 2.0
IDLE_WORKER_SWITCHES = 5.0
HANG_SAME_FRAME_DUMPS = 3

# Rates are averaged over the data wait's own window, within these bounds.
WINDOW_MIN_S = 10.0
WINDOW_MAX_S = 60.0

# Hysteresis: a condition must hold this long to raise a finding, and be gone this long to
# clear it, so findings do not flap tick to tick.
HOLD_S = 10.0
CLEAR_S = 20.0

# --- the throughput model (rules/throughput.py, rules/plan.py) ------------------------------

# Sharpness of the soft minimum of the model's bounds: near a knee, where two bounds are
# close, workers and the loop wait for each other and the real rate falls below both.
# Fitted on bench/advice.py's jobs (docs/BENCHMARKS.md).
SOFTMIN_P = 8.0
# A plan takes the cheapest setting whose predicted rate is within this share of the best
# prediction, as `loadertop tune` does with measured rates.
TOLERANCE = 0.05
# Two measured rates closer than this many standard errors of their difference are the same
# (`loadertop tune`'s settings, the in-place tuner's stretches).
NOISE_Z = 2.0
# A change is proposed for speed only when it predicts at least this gain; below it, it is
# not worth a restart (a cheaper setting for a cost reason is proposed anyway).
MIN_GAIN = 0.05
# Fewer workers or threads, for a cost reason (oversubscription, memory, /dev/shm), only
# where the model predicts no more than this loss.
MAX_LOSS = 0.02
# Loading moved from the main process to workers costs a little on both sides of the hand-over
# (a worker pickles the batch into shared memory, the main process unpickles it): shares of
# the loading, fitted on bench/advice.py's num_workers=0 case (docs/BENCHMARKS.md §8).
RECEIVE_SHARE = 0.1
SEND_SHARE = 0.1
# Worker thread pools that outnumber the CPUs keep (CPUs / busy threads) to this power of
# their CPU as useful work: the rest spins or preempts (fitted on bench/advice.py's threads
# case, docs/BENCHMARKS.md §8).
POOL_WASTE_EXPONENT = 1.7
# Floors that keep the model's divisions finite.
MIN_SERIAL_SHARE = 0.02
MAX_RUNQUEUE_SHARE = 0.9
MIN_PLANNED_CPUS = 0.25
# Workers the plan may propose: I/O-bound loaders gain past the cores, up to this many per CPU.
IO_WORKERS_PER_CPU = 4
# CPUs other processes keep busy below this are no figure to name them by.
MIN_OTHERS_BUSY = 0.2
# A trainer whose workers queue for a CPU takes its CPUs itself only where it uses this share of
# them; below it, something else does (another process, another scheduling group). Half, not
# more: the review's job used 0.28 of 2 CPUs, and a line near a busy host's usual share (a
# 50 % duty load beside a job that fills the rest uses 0.75) would flip the cause with it.
OWN_LOAD_SHARE = 0.5
# Workers seen in state R (running or queued) at least this share of the ticks are not the ones
# that wait on I/O, whatever little CPU they got.
IO_RUNNING_SHARE = 0.5
MAX_WORKERS = 64
# Bytes in flight must leave this much of /dev/shm and of the available memory free.
SHM_LIMIT = 0.80
MEMORY_LIMIT = 0.80
# An I/O-bound loader's workers may outnumber the CPUs: the threads they may run beyond the
# CPUs before the pools count as oversubscribing them.
POOL_SLACK_CPUS = 0.5
# /dev/shm at least this full holds mostly batches in flight: its peak bounds a batch's bytes.
SHM_MOSTLY_IN_FLIGHT = 0.5
# The main thread's run-queue wait slows its serial share by at most this share of it.
MAX_CONTENTION_SHARE = 0.5
# torch's default prefetch_factor.
DEFAULT_PREFETCH = 2
# What a job says of its loader is a claim: a prefetch_factor past this is taken as this (the
# model's arithmetic stays small), and a num_workers past both MAX_WORKERS and the workers
# seen running is not believed (the workers seen are). The plan weighs prefetch values
# only among these, and lists at most MAX_EVIDENCE_SETTINGS of its predictions.
MAX_PREFETCH = 64
PREFETCH_CANDIDATES = (1, 2, 3, 4, 6, 8, 16)
MAX_EVIDENCE_SETTINGS = 24

# The training loop's busy threads queue for a CPU this share of the time each: its own pool
# and its workers contend (rules/plan.main_threads_take_cpus).
MAIN_QUEUED_SHARE = 0.03

# Jobs of many ranks (rules/ranks.py): a rank whose data wait stands this far (a share of the
# loop) above the median of the others' is the job's input straggler, and a rank waits for
# the others when its sync share stands this far above the job's lowest. 15 points: py-spy's
# shares over a window of ~400 samples are within ±5 points, so balanced ranks never differ
# this much by chance, and a straggler that costs the job less is not the first thing to fix.
RANK_GAP = 0.15
RANK_WAIT = 0.15
# A rank's blocked share needs this many ticks of its main thread's figures (their spread is
# its noise).
MIN_RANK_TICKS = 3

# Other processes keep this share of the trainer's CPUs busy: a busy host.
BUSY_HOST_SHARE = 0.25
# A quota that ran out in this share of its periods is binding.
THROTTLED_SHARE = 0.10
# The loop waits for another rank's batch (Accelerate dispatches) in this share of its data wait or more.
DISPATCHED_SHARE = 0.5
# Workers whose threads wait this share of the time for a CPU are starved of CPU: more of
# them would only wait longer.
STARVED_RUNQUEUE_SHARE = 0.20

# A loader starts its workers together: workers started this close belong to one loader.
LOADER_START_SPREAD_S = 2.0
# Stack dumps older than this say nothing about what a worker does now.
STACK_MAX_AGE_S = 60.0

# A trial's measured steps/s this factor or more from the model's prediction (either way): the
# model is off on that job, and its other predictions are said beside that trial.
MISSED_BY = 1.5
# The settings a plan lists as weighed (report `plan.candidates`), its choice first.
MAX_CANDIDATES = 8
