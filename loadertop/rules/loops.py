"""Where a loader setting is written, in the terms of the loop that runs the loader (pure).

A Hugging Face Trainer builds its DataLoaders itself, from `TrainingArguments`; Lightning's
come from the module's `train_dataloader()`; Accelerate rebuilds the DataLoader handed to
`prepare()` with that loader's settings; torchdata's `StatefulDataLoader` takes DataLoader's
own arguments. A change is kept as the user writes it: a `TrainingArguments` section for the
Hugging Face Trainer, a `DataLoader` section everywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..vocabulary import Change, SettingValue

# The DataLoader arguments the Hugging Face Trainer takes from TrainingArguments (transformers
# >= 4.36 has all four); any other (a worker_init_fn) needs a DataLoader of the script's own.
_TRAINING_ARGUMENTS = {"num_workers": "dataloader_num_workers", "prefetch_factor": "dataloader_prefetch_factor",
                       "persistent_workers": "dataloader_persistent_workers", "pin_memory": "dataloader_pin_memory"}
_WHERE = {"lightning": " in train_dataloader()", "accelerate": " given to accelerator.prepare()"}


def _by_arguments(loop: str | None, names: Iterable[str]) -> bool:
    return loop == "huggingface" and all(n in _TRAINING_ARGUMENTS for n in names)


def loader_change(loop: str | None, settings: dict[str, SettingValue]) -> Change:
    """A change's DataLoader settings ({"num_workers": 4}) as a section of the change."""
    if settings and _by_arguments(loop, settings):
        return {"TrainingArguments": {_TRAINING_ARGUMENTS[k]: v for k, v in settings.items()}}
    return {"DataLoader": settings}


def loader_call(loop: str | None, args: list[str], dataset: str | None = None) -> str:
    """`DataLoader(num_workers=2 -> 4) for MyDataset`, as the loop's user writes it."""
    if args and _by_arguments(loop, [a.split("=")[0] for a in args]):
        return f"TrainingArguments({', '.join('dataloader_' + a for a in args)})"
    name = "StatefulDataLoader" if loop == "torchdata" else "DataLoader"
    return f"{name}({', '.join(args)})" + (f" for {dataset}" if dataset else "") + _WHERE.get(loop or "", "")
