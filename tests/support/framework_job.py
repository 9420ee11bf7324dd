"""A training job on a framework's own loop, for tests: torchdata's StatefulDataLoader,
Lightning's Trainer.fit, an Accelerate-prepared loader, or a Hugging Face Trainer. Each item sleeps --sleep-ms (a
slow disk), each step --step-ms (a GPU-like step), so the loop waits for data and the CPUs
stay free. It writes the loop's own measure of its data wait, as loadertop.demo.job does:
{"log": [[epoch time, waited s, elapsed s, steps], ...]}.

--hook: the framework's loadertop form (watch() for StatefulDataLoader and Accelerate, the
callbacks for Lightning and the Hugging Face Trainer), --tune with it: that form with tune=True;
--hook-rank R under torchrun: on rank R only. The truth file also says, at the end, the
workers the loader ended with ("num_workers").
--dispatch (Accelerate, under torchrun):
rank 0 loads every rank's batches and broadcasts them; each rank writes --ready and --truth
with ".RANK" appended.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
from torch.utils.data import Dataset


class Slow(Dataset):
    def __init__(self, sleep_ms: float, length: int = 10**6) -> None:
        self.sleep_ms = sleep_ms
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        time.sleep(self.sleep_ms / 1000.0)
        return torch.full((256,), float(i % 97)), i % 10


class Truth:
    """The loop's own data wait, written every half second."""

    def __init__(self, args) -> None:
        self.args = args
        self.started = time.perf_counter()
        self.waited = 0.0
        self.steps = 0
        self.log: list[list[float]] = []
        self.written = 0.0
        self.first: float | None = None

    def batch(self, waited_s: float) -> None:
        if self.steps == 0:
            self.first = time.perf_counter()
            if self.args.ready:
                open(self.args.ready, "w").close()
        self.waited += waited_s
        self.steps += 1
        now = time.perf_counter()
        if now - self.written >= 0.5:
            self.written = now
            self.log.append([time.time(), self.waited, now - self.started, self.steps])
            tmp = self.args.truth + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "log": self.log}, f)
            os.replace(tmp, self.args.truth)

    def over(self) -> bool:
        """--duration seconds after the first batch (imports and start-up vary by framework),
        or as soon as the --stop file appears: the job then ends as a finished one does."""
        if self.args.stop and os.path.exists(self.args.stop):
            return True
        return self.first is not None and time.perf_counter() - self.first >= self.args.duration


def loader(cls, args):
    return cls(Slow(args.sleep_ms, args.epoch_items), batch_size=args.batch_size, num_workers=args.workers,
               persistent_workers=args.workers > 0)


def run_plain_loop(train, truth: Truth, step_ms: float) -> None:
    while not truth.over():
        it = iter(train)
        while not truth.over():
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            truth.batch(time.perf_counter() - t0)
            time.sleep(step_ms / 1000.0)


def stateful(args, truth: Truth) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    import loadertop

    train = loader(StatefulDataLoader, args)
    if args.hook:
        train = loadertop.watch(train, name="train", tune=args.tune)
    # A checkpoint and a resume, as a trainer does: through the wrapper when there is one.
    it = iter(train)
    for _ in range(3):
        next(it)
    state = train.state_dict()
    assert state, "state_dict() gave nothing"
    del it, train  # the first loader's workers go, as when a job restarts from a checkpoint
    gc.collect()
    resumed = loader(StatefulDataLoader, args)
    if args.hook:
        resumed = loadertop.watch(resumed, name="train", tune=args.tune)
    resumed.load_state_dict(state)
    run_plain_loop(resumed, truth, args.step_ms)


def accelerate(args, truth: Truth) -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    import loadertop

    if args.dispatch:
        from accelerate import DataLoaderConfiguration

        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    else:
        accelerator = Accelerator(cpu=True)
    # Prepared with a model, as a script does (the same calls on every rank: a model's
    # preparation is collective). Watched first: prepare() must still shard the loader, and
    # hand it back watched.
    train = loader(DataLoader, args)
    model, train = accelerator.prepare(torch.nn.Linear(256, 1), loadertop.watch(train, name="train", tune=args.tune)
                                       if args.hook else train)
    prepared = type(getattr(train, "_loader", train)).__name__
    assert prepared in ("DataLoaderShard", "DataLoaderDispatcher"), f"prepare() left a {prepared} unprepared"
    run_plain_loop(train, truth, args.step_ms)


def lightning(args, truth: Truth) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from loadertop.inside.lightning import LoadertopCallback

    class Gaps(L.Callback):
        """The loop's own measure: from one batch's end to the next one's start."""

        def __init__(self) -> None:
            self.ended: float | None = None

        def on_train_epoch_start(self, trainer, module) -> None:
            self.ended = time.perf_counter()

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if self.ended is not None:
                truth.batch(time.perf_counter() - self.ended)
            if truth.over():
                trainer.should_stop = True

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.ended = time.perf_counter()

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(256, 10)

        def training_step(self, batch, batch_idx):
            x, y = batch
            time.sleep(args.step_ms / 1000.0)
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = [Gaps()] + ([LoadertopCallback(tune=args.tune)] if args.hook else [])
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1000, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Model(), train_dataloaders=loader(DataLoader, args))


class SlowDicts(Slow):
    """The same items as a Hugging Face Trainer wants them: dicts its collator stacks."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return {"x": x, "labels": y}


def huggingface(args, truth: Truth) -> None:
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments

    from loadertop.inside.huggingface import LoadertopCallback

    class Gaps(TrainerCallback):
        """The loop's own measure: from one step's end to the next one's start."""

        def __init__(self) -> None:
            self.ended: float | None = None

        def on_epoch_begin(self, args_, state, control, **kwargs):
            self.ended = time.perf_counter()

        def on_step_begin(self, args_, state, control, **kwargs):
            if self.ended is not None:
                truth.batch(time.perf_counter() - self.ended)
            if truth.over():
                control.should_training_stop = True

        def on_step_end(self, args_, state, control, **kwargs):
            self.ended = time.perf_counter()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(256, 10)

        def forward(self, x, labels):
            time.sleep(args.step_ms / 1000.0)
            return {"loss": torch.nn.functional.cross_entropy(self.layer(x), labels)}

    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(out, per_device_train_batch_size=args.batch_size, max_steps=10**6,
                                     dataloader_num_workers=args.workers,
                                     dataloader_persistent_workers=args.workers > 0,
                                     use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                     disable_tqdm=True)
        callbacks = [Gaps()] + ([LoadertopCallback(tune=args.tune)] if args.hook else [])
        Trainer(model=Model(), args=training, train_dataset=SlowDicts(args.sleep_ms, args.epoch_items),
                callbacks=callbacks).train()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["stateful", "lightning", "accelerate", "huggingface"], required=True)
    p.add_argument("--hook", action="store_true")
    p.add_argument("--tune", action="store_true", help="with --hook: the framework's form with tune=True")
    p.add_argument("--epoch-items", type=int, default=10**6, help="items an epoch")
    p.add_argument("--hook-rank", type=int, help="under torchrun: the framework's loadertop form on this rank only")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sleep-ms", type=float, default=10.0)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=60.0, help="seconds after the first batch")
    p.add_argument("--ready")
    p.add_argument("--truth")
    p.add_argument("--stop", help="end the loop once this file exists")
    p.add_argument("--dispatch", action="store_true", help="Accelerate: rank 0 loads and broadcasts")
    args = p.parse_args()
    rank = os.environ.get("RANK")
    if rank is not None:  # under torchrun: one file of each kind per rank
        args.ready = args.ready and f"{args.ready}.{rank}"
        args.truth = args.truth and f"{args.truth}.{rank}"
        args.hook = args.hook or args.hook_rank == int(rank)
    torch.set_num_threads(1)
    if args.tune:
        from support.fast_tune_job import fast

        fast()  # the tests watch it tune: a test of seconds, not of the defaults' pace
    run = {"stateful": stateful, "lightning": lightning, "accelerate": accelerate, "huggingface": huggingface}
    run[args.framework](args, Truth(args))


if __name__ == "__main__":
    main()
