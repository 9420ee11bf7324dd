"""The tuner's changes at an epoch boundary on real loaders in this process (loader.py): a
persistent loader whose workers are replaced yields the batches an untouched loop yields, the
plain DataLoader and torchdata's StatefulDataLoader alike (whose sampler draws its order when
an iterator is made, twice for a new one: its place is carried over instead)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from loadertop.autotune import loader as L
from loadertop.model import Knobs


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        return i


def batches(make, changes: dict[int, int]) -> list[list[int]]:
    """Four seeded epochs; at the boundary before epoch e, the worker count changes[e] is set
    as the tuner sets it (the replaced iterator's workers seeded from a private generator)."""
    torch.manual_seed(0)
    loader = make()
    out: list[list[int]] = []
    for epoch in range(4):
        restore = None
        if epoch in changes:
            seed = L.base_seed(loader)
            if L.apply(loader, Knobs(changes[epoch], 2)):
                restore = (loader, seed)
        if restore is not None:
            with L.private_seed(*restore):
                iterator = iter(loader)
        else:
            iterator = iter(loader)
        for batch in iterator:
            out.append(batch.tolist())
            torch.rand(3)  # the step's own draw from the global RNG
    return out


def plain():
    return torch.utils.data.DataLoader(Items(), batch_size=4, shuffle=True, num_workers=1, persistent_workers=True)


def stateful():
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(Items(), batch_size=4, shuffle=True, num_workers=1, persistent_workers=True)


@pytest.mark.parametrize("make", [plain, stateful], ids=["DataLoader", "StatefulDataLoader"])
@pytest.mark.parametrize("changes", [{1: 2}, {1: 2, 2: 1}], ids=["one-change", "a-trial-and-back"])
def test_a_persistent_loader_changed_at_epoch_boundaries_yields_the_untouched_batches(make, changes):
    if make is stateful and importlib.util.find_spec("torchdata") is None:
        pytest.skip("needs torchdata (the test extras)")
    untouched = batches(make, {})
    assert batches(make, changes) == untouched
    assert len(untouched) == 40 and untouched[:10] != untouched[10:20]  # shuffled, epoch by epoch
