"""Three pipelines as their users write them, for bench/pipelines.py (issue 45). Each makes its
own small data on first use (under --data) and trains a small model on the CPU:

- `timm`: timm's own loader, `timm.data.create_dataset` + `create_loader` (its PrefetchLoader
  around a DataLoader, its RandomResizedCrop/flip/normalize), a `timm.create_model` ResNet:
  the loop of timm's `train.py`, with its `--workers`/`-j` flag;
- `hf`: a Hugging Face `Trainer` whose collator tokenizes (a WordLevel tokenizer trained here on
  the made-up text, wrapped as a `PreTrainedTokenizerFast`), a small BERT built from its config,
  `dataloader_num_workers`;
- `wds`: webdataset shards through `WebLoader`, `.decode("pil").to_tuple().map_tuple().batched(32)`
  and `batch_size=None`, a small CNN.

Every item carries its index (timm: a class per image; hf: an `idx` column the model records;
wds: the sample's key), so each epoch's items are counted: none repeated, none lost.

--tune: `loadertop.watch(loader, tune=True)` (timm, wds) or `LoadertopCallback(tune=True)` (hf).
The job logs one line per step to --log ("time epoch"), one JSON line per epoch to --epochs-log
({"epoch", "items", "unique", "expected", "workers"}), and touches --ready at its first step.
Threads are the environment's (OMP_NUM_THREADS), as the advice sets them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

IMAGES = 1024  # items per epoch: 32 batches of 32
SHARDS = 16  # more than the most workers tried, so every worker has shards
TEXTS = 1024
SIDE = 96  # made-up images are 96x96 JPEGs, cropped to 64


class Log:
    def __init__(self, args) -> None:
        self.steps = open(args.log, "a", buffering=1)  # noqa: SIM115 (the job's life)
        self.epochs = open(args.epochs_log, "a", buffering=1)  # noqa: SIM115
        self.ready = Path(args.ready)
        self.seen: list[int] = []

    def step(self, epoch: int, ids) -> None:
        self.seen.extend(int(i) for i in ids)
        self.steps.write(f"{time.time():.4f} {epoch}\n")
        if not self.ready.exists():
            self.ready.touch()

    def epoch_end(self, epoch: int, expected: int, workers: int) -> None:
        self.epochs.write(json.dumps({"epoch": epoch, "items": len(self.seen), "unique": len(set(self.seen)),
                                      "expected": expected, "workers": workers}) + "\n")
        self.seen = []


# --- data ------------------------------------------------------------------------------------


def image_bytes(i: int) -> bytes:
    """A JPEG of noise and shapes, different for each index (decoding costs what a photo's does)."""
    import io

    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x, y = rng.integers(0, SIDE, 2)
        draw.ellipse([int(x), int(y), int(x) + 20, int(y) + 20], fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_images(folder: Path) -> None:
    """An ImageFolder: one class folder per image, so that the target is the item's index."""
    if (folder / "done").exists():
        return
    for i in range(IMAGES):
        d = folder / f"c{i:05d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "img.jpg").write_bytes(image_bytes(i))
    (folder / "done").touch()


def make_shards(folder: Path) -> None:
    if (folder / "done").exists():
        return
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    per = IMAGES // SHARDS
    for s in range(SHARDS):
        with wds.TarWriter(str(folder / f"shard-{s:06d}.tar")) as sink:
            for i in range(s * per, (s + 1) * per):
                sink.write({"__key__": f"{i:06d}", "jpg": image_bytes(i), "cls": str(i % 10).encode()})
    (folder / "done").touch()


WORDS = [f"w{n}" for n in range(3000)]


def make_texts() -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 250))) for _ in range(TEXTS)]


# --- timm ------------------------------------------------------------------------------------


def run_timm(args, log: Log) -> None:
    import timm
    import timm.data
    import torch

    import loadertop

    folder = Path(args.data) / "images"
    make_images(folder)
    dataset = timm.data.create_dataset("", root=str(folder), is_training=True)
    loader = timm.data.create_loader(dataset, input_size=(3, 64, 64), batch_size=32, is_training=True,
                                     use_prefetcher=True, num_workers=args.workers, device=torch.device("cpu"),
                                     persistent_workers=args.workers > 0)
    if args.tune:
        loader = loadertop.watch(loader, tune=True)
    model = timm.create_model("resnet10t", num_classes=IMAGES)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    end = time.monotonic() + args.duration
    for epoch in range(args.epochs):
        for images, target in loader:
            loss = loss_fn(model(images), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.step(epoch, target.tolist())
        log.epoch_end(epoch, IMAGES, workers_of(loader))
        if time.monotonic() > end:
            return


def workers_of(loader) -> int:
    from loadertop.wrapped import innermost

    return int(innermost(loader).num_workers)


# --- Hugging Face ------------------------------------------------------------------------------


def run_hf(args, log: Log) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        PreTrainedTokenizerFast,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    texts = make_texts()
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.normalizer = __import__("tokenizers").normalizers.NFKC()
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]")

    def collate(rows):  # runs in the loader's workers: tokenization is the loader's work
        out = tokenizer([r["text"] for r in rows], padding="max_length", truncation=True, max_length=256,
                        return_tensors="pt")
        out["labels"] = torch.tensor([r["idx"] % 2 for r in rows])
        out["idx"] = torch.tensor([r["idx"] for r in rows])
        return out

    class Recorded(BertForSequenceClassification):
        def forward(self, idx=None, **kw):
            if idx is not None and self.training:
                state["ids"].extend(idx.tolist())
            return super().forward(**kw)

    state: dict = {"ids": []}
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=256)
    model = Recorded(config)
    rows = [{"text": t, "idx": i} for i, t in enumerate(texts)]

    class Steps(TrainerCallback):
        def on_step_end(self, a, s, control, **kw):
            log.step(int(s.epoch or 0), state["ids"])
            state["ids"] = []

        def on_epoch_end(self, a, s, control, train_dataloader=None, **kw):
            epoch = round(s.epoch or 0) - 1
            log.epoch_end(epoch, TEXTS, workers_of(train_dataloader) if train_dataloader is not None else -1)
            if time.monotonic() > end:  # at an epoch's end, so that every epoch logged is whole
                control.should_training_stop = True

    callbacks: list = [Steps()]
    if args.tune:
        from loadertop.inside.huggingface import LoadertopCallback

        callbacks.append(LoadertopCallback(tune=True))
    targs = TrainingArguments(output_dir=str(Path(args.data) / "hf-out"), per_device_train_batch_size=32,
                              num_train_epochs=args.epochs, dataloader_num_workers=args.workers, use_cpu=True,
                              report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                              remove_unused_columns=False, learning_rate=1e-4)
    end = time.monotonic() + args.duration
    trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=collate, callbacks=callbacks)
    trainer.train()


# --- webdataset --------------------------------------------------------------------------------


def run_wds(args, log: Log) -> None:
    import numpy as np
    import torch
    import webdataset as wds

    import loadertop

    folder = Path(args.data) / "shards"
    make_shards(folder)
    rng = np.random.default_rng()
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)

    def transform(img):  # a random crop, a flip, normalized: the usual augmentation, by hand
        x, y = (int(v) for v in rng.integers(0, SIDE - 64, 2))
        a = np.asarray(img.crop((x, y, x + 64, y + 64)), dtype=np.float32) / 255.0
        if rng.random() < 0.5:
            a = a[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(((a - mean) / std).transpose(2, 0, 1)))

    urls = str(folder / f"shard-{{000000..{SHARDS - 1:06d}}}.tar")
    dataset = (wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
               .to_tuple("jpg", "cls", "__key__").map_tuple(transform, int, str).batched(32))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=args.workers,
                           persistent_workers=False)
    if args.tune:
        loader = loadertop.watch(loader, tune=True, shards_by_worker=True)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    end = time.monotonic() + args.duration
    for epoch in range(args.epochs):
        for images, labels, keys in loader:
            loss = loss_fn(model(images), torch.as_tensor(labels))
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.step(epoch, [int(k) for k in keys])
        log.epoch_end(epoch, IMAGES, workers_of(loader))
        if time.monotonic() > end:
            return


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pipeline", choices=("timm", "hf", "wds"), required=True)
    p.add_argument("--data", required=True, help="where the made-up data lives (made on first use)")
    p.add_argument("--workers", "-j", type=int, default=4)
    p.add_argument("--tune", action="store_true")
    p.add_argument("--main-threads", type=int, default=0, help="torch.set_num_threads(N) first (0: torch's own)")
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--duration", type=float, default=60.0, help="stop at the first epoch end after this")
    p.add_argument("--log", required=True)
    p.add_argument("--epochs-log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--prepare", action="store_true", help="make the data and exit")
    args = p.parse_args()
    if args.prepare:
        if args.pipeline == "timm":
            make_images(Path(args.data) / "images")
        elif args.pipeline == "wds":
            make_shards(Path(args.data) / "shards")
        return
    if args.tune:  # the tuner's decisions in the job's log, as a user running it sees them
        import logging

        logging.basicConfig(format="%(message)s")
        logging.getLogger("loadertop.tune").setLevel(logging.INFO)
    if args.main_threads:
        import torch

        torch.set_num_threads(args.main_threads)
    log = Log(args)
    {"timm": run_timm, "hf": run_hf, "wds": run_wds}[args.pipeline](args, log)


if __name__ == "__main__":
    main()
