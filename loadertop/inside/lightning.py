"""`Trainer(callbacks=[loadertop.lightning.LoadertopCallback()])`: exact data wait of a
Lightning `fit`, with no change to the loaders.

Lightning fetches each batch between one `on_*_batch_end` and the next `on_*_batch_start`,
so that gap is the loop's wait for data (plus Lightning's few µs of bookkeeping). The
callback publishes it through the same /dev/shm file as `loadertop.watch()`, one per
loader kind (train, val). Importing this module imports Lightning; nothing else does.
"""

from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[assignment]

from ..hookfile import DIRECTORY
from .gaps import FetchGaps


class LoadertopCallback(Callback):
    """Publishes the train and validation loaders' data wait for loadertop to read."""

    def __init__(self, directory: str = DIRECTORY, tune: bool = False) -> None:
        # tune=True: the training loader's num_workers and prefetch_factor are tuned in place
        # between epochs (loadertop/autotune); the loader itself is the framework's.
        self.train = FetchGaps("train", directory, "lightning", tune=tune)
        self.val = FetchGaps("val", directory, "lightning")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.train.start(trainer.train_dataloader, new_iterator=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train.got(trainer.train_dataloader, batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train.start(trainer.train_dataloader)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.train.pause()

    def on_validation_start(self, trainer, pl_module) -> None:
        self.train.pause()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.val.start(trainer.val_dataloaders, new_iterator=True)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.got(trainer.val_dataloaders, batch)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.start(trainer.val_dataloaders)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.val.pause()
        if getattr(trainer.state, "fn", None) == "fit":  # validation inside fit, not validate()
            self.train.start(trainer.train_dataloader)  # back to fetching training batches

    def teardown(self, trainer, pl_module, stage) -> None:
        self.train.close()
        self.val.close()
