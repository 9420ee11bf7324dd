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


# Command-line flags by which training scripts set their loader's worker count: timm's and
# torchvision's references (`--workers`, `-j`), Hugging Face's example scripts
# (`--dataloader_num_workers`), and the common spellings of `num_workers`.
WORKER_FLAGS = ("--workers", "-j", "--num-workers", "--num_workers", "--dataloader-num-workers",
                "--dataloader_num_workers", "--data-workers", "--data_workers", "--loader-workers")


def worker_flag(cmdline: Iterable[str], num_workers: int) -> str | None:
    """The flag on the trainer's command line that set its loader's worker count: one of
    WORKER_FLAGS whose value is the count the loader runs (`--workers 4` or `--workers=4`, `-j4`),
    so the change can be said in the words its user types. None where no flag says it."""
    args = list(cmdline)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if not eq and i + 1 < len(args):
            value = args[i + 1]
        if flag in WORKER_FLAGS and value == str(num_workers):
            return flag
        if arg.startswith("-j") and arg[2:] == str(num_workers):
            return "-j"
    return None


def _by_arguments(loop: str | None, names: Iterable[str]) -> bool:
    return loop == "huggingface" and all(n in _TRAINING_ARGUMENTS for n in names)


def loader_change(loop: str | None, settings: dict[str, SettingValue]) -> Change:
    """A change's DataLoader settings ({"num_workers": 4}) as a section of the change."""
    if settings and _by_arguments(loop, settings):
        return {"TrainingArguments": {_TRAINING_ARGUMENTS[k]: v for k, v in settings.items()}}
    return {"DataLoader": settings}


def loader_call(loop: str | None, args: list[str], dataset: str | None = None, flag: str | None = None) -> str:
    """`DataLoader(num_workers=2 -> 4) for MyDataset`, as the loop's user writes it; where a
    command-line flag set the count (`flag`), `--workers 2 -> 4` on the command line."""
    if flag is not None and args and args[0].startswith("num_workers="):
        said = f"{flag} {args[0].removeprefix('num_workers=')} on the command line"
        rest = args[1:]
        return said + (f" and {loader_call(loop, rest, dataset)}" if rest else "")
    if args and _by_arguments(loop, [a.split("=")[0] for a in args]):
        return f"TrainingArguments({', '.join('dataloader_' + a for a in args)})"
    name = "StatefulDataLoader" if loop == "torchdata" else "DataLoader"
    return f"{name}({', '.join(args)})" + (f" for {dataset}" if dataset else "") + _WHERE.get(loop or "", "")
