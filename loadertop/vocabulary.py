"""The closed sets of words in loadertop's data, as types: mypy checks every value written
into a snapshot, a finding or a plan against them, and the recording's reader refuses any
other (outputs/record.py reads `Literal`s). The report's schema lists the same values.

Standard library only, imported by the pipeline, the rules and the outputs alike.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

# A process's state, from the letter in /proc/<pid>/stat (probes/processes.py); "exited" once it is gone.
ProcessStatus = Literal["running", "sleeping", "disk-sleep", "stopped", "zombie", "exited", "idle"]
TrainerStatus = Literal["running", "exited"]
# How a worker was recognised (probes/discovery.py): its thread name, the hook's list, a stack.
FoundBy = Literal["name", "hook", "stack"]
# Where a data wait comes from: py-spy's stack samples, or the hook's exact timing.
WaitSource = Literal["py-spy", "hook"]
# Frameworks whose loops loadertop recognises: the advice names their own settings.
Loop = Literal["huggingface", "lightning", "accelerate", "torchdata"]
EventKind = Literal["worker_started", "worker_exited", "trainer_found", "trainer_exited"]
Severity = Literal["info", "warning", "critical"]
# The in-place tuner (watch(loader, tune=True)): where it is, and what each decision did.
TunePhase = Literal["warm-up", "measuring", "trying", "settled", "off"]
TuneAction = Literal["try", "keep", "revert", "settle", "off"]
# The root cause of a trainer's data wait (rules/plan.py says each), most fundamental first.
Cause = Literal["stalled", "dispatched", "threads", "main_threads", "quota", "busy_host", "too_many_workers",
                "loader_cpu",
                "loader_io", "loader", "main_loading", "receiving", "none", "unknown"]
# What bounds the CPUs a trainer can get (rules/measure.py).
CpuLimitKind = Literal["cpus", "quota", "shared", "busy_host"]
# What capped the setting a plan chose, besides a CPU limit.
PlanLimit = Literal["cpus", "quota", "shared", "busy_host", "main_process", "shm", "memory", "max_workers"]
# The parts of a plan a finding carries.
PlanPart = Literal["workers", "threads", "shm"]

LOOP_NAMES: tuple[Loop, ...] = get_args(Loop)
TUNE_PHASES: tuple[TunePhase, ...] = get_args(TunePhase)
TUNE_ACTIONS: tuple[TuneAction, ...] = get_args(TuneAction)
CAUSES: tuple[Cause, ...] = get_args(Cause)

SettingValue = int | bool | str | None  # one argument's value in a change


class Change(TypedDict, total=False):
    """What a finding says to change, in the sections the user writes it in:
    {"DataLoader": {"num_workers": 4}, "dataset": "ImageFolder"}."""

    DataLoader: dict[str, SettingValue]  # DataLoader(...) arguments (StatefulDataLoader's alike)
    TrainingArguments: dict[str, SettingValue]  # the Hugging Face Trainer's dataloader_* arguments
    env: dict[str, str]  # environment variables of the training job (OMP_NUM_THREADS)
    script: str  # a call in the training script (torch.set_num_threads(1)), where the setting is made there
    docker: dict[str, str]  # the container's settings (shm_size)
    dataset: str  # the dataset class of the loader the change is for


# A finding's evidence as the outputs read it: the measured figures behind it, by name. Each
# rule writes its own TypedDict (rules/evidence.py), which the type check holds it to.
Evidence = dict[str, Any]
