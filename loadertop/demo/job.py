"""The built-in training job: a small CPU torch model fed by a DataLoader whose cost,
worker count and habits are set by flags. `loadertop demo` runs it in scenarios; the tests
and benchmarks run it with explicit flags.

It measures its own ground truth (seconds blocked in next(loader), steps) and, with
--truth FILE, rewrites that file about every half second.

CPU costs are fixed amounts of work (a loop count), never a spin until a deadline: a
deadline spin finishes on time even on half a core, which would make more workers than
cores look faster than they are. `--item-ms` and `--step-cpu-ms` are converted to a loop
count once, by timing the loop on a free core (or from `--work-per-ms`, so that several
runs of a benchmark do the same work).

This module imports torch; the monitor never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info


def work(units: int) -> int:
    """A fixed amount of CPU work: `units` turns of a small integer loop (~25 µs each)."""
    x = 0
    for _ in range(units):
        for i in range(200):
            x ^= i * 2654435761
    return x


def calibrate(trials: int = 20, units: int = 40) -> float:
    """Work units per millisecond of one free core: the fastest of several ~1 ms trials,
    so that a busy machine at start-up does not shrink the work."""
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        work(units)
        best = min(best, time.perf_counter() - t0)
    return units / (best * 1000.0)


def units_for(ms: float, per_ms: float) -> int:
    return max(1, round(ms * per_ms)) if ms > 0 else 0


def library_pool_size() -> int:
    """The thread pool a BLAS-like library starts in each worker: OMP_NUM_THREADS where
    set (OpenBLAS and MKL honour it), else one thread per CPU it may run on."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0))


class Item:
    """Per-item work shared by the map-style and iterable datasets (picklable for spawn)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.objects = [{"id": i, "name": f"item-{i}"} for i in range(cfg["objects"])]
        self.threads_set = False
        self.images: list[str] = []
        if cfg["images"]:
            from .images import write_images

            self.images = write_images(cfg["image_dir"], cfg["images"])

    def make(self, i: int):
        cfg = self.cfg
        if self.images:
            from .images import decode

            return decode(self.images[i % len(self.images)], seed=i), i % 10
        if cfg["item_units"]:
            work(cfg["item_units"])
        if cfg["sleep_ms"]:
            time.sleep(cfg["sleep_ms"] / 1000.0)
        if self.objects:
            # Reading Python objects writes their refcounts: copy-on-read in workers. Each
            # item reads the next slice, so a worker's private memory grows steadily.
            chunk = cfg["objects_per_item"]
            start = (i * chunk) % len(self.objects)
            for obj in self.objects[start : start + chunk]:
                _ = obj["id"]
        if cfg["worker_threads"] != 1:
            if not self.threads_set:
                # 0: the pool a library would start (as numpy's BLAS or OpenCV do in workers,
                # where torch's own pool is set to one thread); N: code that asks for N.
                threads = cfg["worker_threads"] or library_pool_size()
                torch.set_num_threads(threads)
                self.threads_set = True
            a = torch.randn(384, 384)
            for _ in range(cfg["matmuls"]):
                a = torch.tanh(a @ a)
        sample = torch.full((cfg["tensor_kb"] * 256,), float(i % 97))
        if cfg["tensors_per_item"] > 1:  # many small tensors: each one is its own hand-over
            return [sample[k :: cfg["tensors_per_item"]].clone() for k in range(cfg["tensors_per_item"])], i % 10
        return sample, i % 10


class MapData(Dataset):
    def __init__(self, cfg: dict) -> None:
        self.item = Item(cfg)
        self.length = cfg["epoch_items"]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.item.make(i)


class ValData(MapData):
    """The validation set: its own class, so that its loader is told apart from training's."""

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.length = cfg["val_items"]


class StreamData(IterableDataset):
    def __init__(self, cfg: dict) -> None:
        self.item = Item(cfg)
        self.length = cfg["epoch_items"]

    def __iter__(self):
        info = get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        for i in range(wid, self.length, n):
            yield self.item.make(i)


def _first_tensor(batch):
    first = batch[0]
    return first[0] if isinstance(first, list) else first


class LimitThreads:
    """worker_init_fn that caps each worker's thread pools, as threadpoolctl would."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        torch.set_num_threads(self.threads)


class SmallCNN:
    """The step of an image pipeline on the CPU: a small CNN trained on the batch's images, its
    convolutions run on the loop's torch threads."""

    def __init__(self, width: int) -> None:
        c = width
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, c, 5, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(c, 2 * c, 3, stride=2),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * c, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train_on(self, batch) -> None:
        images = _first_tensor(batch).float().div_(255.0)
        loss = torch.nn.functional.cross_entropy(self.model(images), batch[1])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def build(args):
    cfg = vars(args)

    def loader(dataset, workers):
        kwargs = dict(batch_size=args.batch_size, num_workers=workers)
        if workers > 0:
            kwargs.update(
                multiprocessing_context=args.context,
                persistent_workers=args.persistent,
                prefetch_factor=args.prefetch,
            )
            if args.limit_worker_threads:
                kwargs["worker_init_fn"] = LimitThreads(args.limit_worker_threads)
        return DataLoader(dataset, pin_memory=args.pin_memory, **kwargs)

    dataset = StreamData(cfg) if args.iterable else MapData(cfg)
    train = loader(dataset, args.workers)
    val = loader(ValData(cfg), args.val_workers) if args.val_workers else None
    if args.watch or args.tune:
        from loadertop import watch

        train = watch(train, name="train", tune=args.tune)
        val = watch(val, name="val") if val is not None else None
    return train, val


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadertop.demo.job")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--context", default="fork", choices=["fork", "spawn", "forkserver"])
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epoch-items", type=int, default=10**6)
    p.add_argument("--item-ms", type=float, default=0.0, help="CPU work per item (a fixed loop count)")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="I/O-like sleep per item")
    p.add_argument("--step-ms", type=float, default=5.0,
                   help="the step's accelerator time: the CPU is free meanwhile (on CPU, a sleep)")
    p.add_argument("--step-cpu-ms", type=float, default=0.0, help="CPU work of the training loop per step")
    p.add_argument("--work-per-ms", type=float, default=None,
                   help="work units per ms for --item-ms/--step-cpu-ms (default: timed at start)")
    p.add_argument("--tensor-kb", type=int, default=4, help="size of each sample")
    p.add_argument("--tensors-per-item", type=int, default=1, help="split each sample into this many tensors")
    p.add_argument("--objects", type=int, default=0, help="Python objects the dataset holds")
    p.add_argument("--objects-per-item", type=int, default=200, help="objects each item reads")
    p.add_argument("--worker-threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--main-threads", type=int, default=1,
                   help="torch threads of the training loop (0: one per usable CPU, torch's default)")
    p.add_argument("--matmuls", type=int, default=4)
    p.add_argument("--images", type=int, default=0,
                   help="items decode one of N real JPEG files with PIL (crop, resize to 224, flip)")
    p.add_argument("--image-dir", default=os.path.join(tempfile.gettempdir(), f"loadertop-demo-images-{os.geteuid()}"),
                   help="where the JPEG files are written once and kept")
    p.add_argument("--step-matmul", type=int, default=0,
                   help="the step also multiplies two N x N matrices on the loop's torch threads")
    p.add_argument("--step-matmuls", type=int, default=1, help="how many such products a step computes")
    p.add_argument("--step-conv", type=int, default=0,
                   help="the step trains a small CNN of this width on the batch's images (with --images)")
    p.add_argument("--limit-worker-threads", type=int, default=0,
                   help="a worker_init_fn that caps each worker's thread pools at N")
    p.add_argument("--val-workers", type=int, default=0, help="a validation loader each epoch")
    p.add_argument("--val-items", type=int, default=64, help="items of the validation set")
    p.add_argument("--rank-cpus", type=int, default=0,
                   help="pin each rank to its own N CPUs (by LOCAL_RANK), as a launcher that binds ranks")
    p.add_argument("--late-start", type=float, default=0.0, help="seconds before the loader")
    p.add_argument("--duration", type=float, default=60.0, help="stop after this many seconds")
    p.add_argument("--truth", help="write measured data wait to this JSON file (FILE.RANK under torchrun)")
    p.add_argument("--ready", help="touch this file when the first batch arrives (FILE.RANK under torchrun)")
    p.add_argument("--dist", action="store_true", help="join a gloo process group (torchrun)")
    p.add_argument("--ddp", action="store_true", help="with --dist: the model is a DistributedDataParallel (lockstep)")
    p.add_argument("--slow-rank", type=int, default=None,
                   help="under torchrun: this rank's items and step take the --slow-* figures instead")
    p.add_argument("--slow-sleep-ms", type=float, default=None, help="the slow rank's I/O-like sleep per item")
    p.add_argument("--slow-item-ms", type=float, default=None, help="the slow rank's CPU work per item")
    p.add_argument("--slow-step-cpu-ms", type=float, default=None, help="the slow rank's own CPU work per step")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU training step")
    p.add_argument("--watch", action="store_true", help="publish exact data wait with loadertop.watch")
    p.add_argument("--tune", action="store_true",
                   help="watch(..., tune=True): tune num_workers and prefetch_factor in place")
    args = p.parse_args(argv)
    if args.slow_rank is not None and os.environ.get("RANK") == str(args.slow_rank):
        # One rank of the job reads a slow shard or steps on a slower device: the others wait for it.
        for name in ("sleep_ms", "item_ms", "step_cpu_ms"):
            slow = getattr(args, f"slow_{name}")
            if slow is not None:
                setattr(args, name, slow)
    cpu_work = args.item_ms or args.step_cpu_ms or args.slow_item_ms or args.slow_step_cpu_ms
    per_ms = args.work_per_ms or (calibrate() if cpu_work else 0.0)
    if args.rank_cpus:
        first = int(os.environ.get("LOCAL_RANK", "0")) * args.rank_cpus
        os.sched_setaffinity(0, set(range(first, first + args.rank_cpus)))  # workers inherit it

    torch.manual_seed(0)
    # One compute thread in the loop: a small model gains nothing from more, and a pool
    # that competes with the workers for the CPUs would blur every scenario. 0: torch's own
    # default, as a plain script has it (one per CPU, or what OMP_NUM_THREADS says).
    if args.main_threads:
        torch.set_num_threads(args.main_threads)
    if args.dist and "RANK" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if not args.work_per_ms:
            # Every rank does rank 0's amount of work: ranks that timed the loop apart, at a
            # start-up that crowds the CPUs, can differ by a quarter and are no longer alike.
            shared = [per_ms]
            dist.broadcast_object_list(shared, src=0)
            per_ms = shared[0]
        # Each rank its own files: two ranks renaming one file over each other would crash one.
        if args.ready:
            args.ready = f"{args.ready}.{os.environ['RANK']}"
        if args.truth:
            args.truth = f"{args.truth}.{os.environ['RANK']}"
    args.item_units = units_for(args.item_ms, per_ms)
    step_units = units_for(args.step_cpu_ms, per_ms)
    if args.late_start:
        time.sleep(args.late_start)
    try:
        train, val = build(args)
    except OSError as e:  # the image folder (images.private_folder): one line, no traceback
        print(f"loadertop demo job: {e}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    width = 256 if device.type == "cpu" else 4096  # on a GPU, a step that keeps it busy
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                                 torch.nn.Linear(width, 10)).to(device)
    if args.ddp and args.dist and "RANK" in os.environ:
        # The gradient all-reduce inside backward() keeps the ranks in lockstep: a rank whose
        # batch came sooner waits there for the slowest.
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32 if device.type == "cpu" else 1024, width, device=device)
    y = torch.randint(0, 10, (x.shape[0],), device=device)
    big = torch.randn(args.step_matmul, args.step_matmul)
    cnn = SmallCNN(args.step_conv) if args.step_conv else None
    product = torch.empty_like(big)

    started = time.perf_counter()
    waited = 0.0
    steps = 0
    last_write = 0.0
    log: list[list[float]] = []
    truth = {"pid": os.getpid(), "wait_s": 0.0, "elapsed_s": 0.0, "steps": 0, "log": log}

    def write_truth(now: float) -> None:
        truth.update(wait_s=waited, elapsed_s=now - started, steps=steps)
        if getattr(train, "_tuner", None) is not None:
            truth["tune"] = train._tuner.as_dict()
        log.append([time.time(), waited, now - started, steps, epoch])
        tmp = args.truth + ".tmp"
        with open(tmp, "w") as f:
            json.dump(truth, f)
        os.replace(tmp, args.truth)

    epoch = 0
    if args.tune:  # the tuner's decisions, as a user who turns its logger on sees them
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
        logging.getLogger("loadertop.tune").setLevel(logging.INFO)
    while time.perf_counter() - started < args.duration:
        it = iter(train)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t0
            if steps == 0 and args.ready:
                open(args.ready, "w").close()
            # The step: a real forward/backward/optimizer pass, the loop's own CPU work, and
            # step_ms on the accelerator. On a GPU that is real compute; on the CPU a sleep, so
            # that the CPUs are free for the workers meanwhile, as they are while a GPU computes.
            end = time.perf_counter() + args.step_ms / 1000.0
            while True:
                shift = _first_tensor(batch)[:1, :1].to(device, non_blocking=True).float().mean()
                loss = torch.nn.functional.cross_entropy(model(x + shift), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if device.type != "cuda":
                    break
                torch.cuda.synchronize()
                if time.perf_counter() >= end:
                    break
            if step_units:
                work(step_units)
            if cnn is not None:
                cnn.train_on(batch)
            for _ in range(args.step_matmuls if args.step_matmul else 0):
                # A multi-threaded op: every one of the loop's threads must finish its share,
                # so one preempted thread holds the whole product back.
                torch.mm(big, big, out=product)
            if device.type != "cuda" and args.step_ms:
                time.sleep(max(0.0, end - time.perf_counter()))
            steps += 1
            now = time.perf_counter()
            if args.truth and now - last_write >= 0.5:
                write_truth(now)
                last_write = now
            if now - started >= args.duration:
                break
        epoch += 1
        if val is not None:
            for _ in val:
                pass
    if args.truth:
        write_truth(time.perf_counter())
    return 0


if __name__ == "__main__":
    sys.exit(main())
