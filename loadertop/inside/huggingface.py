"""`Trainer(..., callbacks=[loadertop.huggingface.LoadertopCallback()])`: exact data wait of a
Hugging Face `Trainer`, with no change to its loader.

The Trainer fetches a step's batches (all its gradient-accumulation micro-batches at once)
between one `on_step_end` and the next `on_step_begin`: that gap is the wait for data.
Evaluation, checkpoints and logging also run after `on_step_end`; each restarts the count
when it ends, so that they are not taken for waiting. Importing this module imports
transformers; nothing else does.
"""

from __future__ import annotations

from transformers import TrainerCallback

from ..hookfile import DIRECTORY
from .gaps import FetchGaps


class LoadertopCallback(TrainerCallback):
    """Publishes the training loader's data wait for loadertop to read."""

    def __init__(self, directory: str = DIRECTORY, tune: bool = False) -> None:
        # tune=True: the training loader's num_workers and prefetch_factor are tuned in place
        # between epochs (loadertop/autotune); the loader itself is the framework's.
        self.train = FetchGaps("train", directory, "huggingface", tune=tune)

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.train.start(train_dataloader, new_iterator=True)

    def on_step_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.train.got(train_dataloader, None)

    def on_step_end(self, args, state, control, train_dataloader=None, **kwargs):
        self.train.start(train_dataloader)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.train.pause()  # evaluating, not waiting for training data

    def on_evaluate(self, args, state, control, train_dataloader=None, **kwargs):
        self.train.start(train_dataloader)

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        self.train.start(train_dataloader)

    def on_log(self, args, state, control, train_dataloader=None, **kwargs):
        if self.train.fetching_since is not None:
            self.train.start(train_dataloader)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.train.pause()

    def on_train_end(self, args, state, control, **kwargs):
        self.train.close()
