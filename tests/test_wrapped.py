"""The DataLoader inside the wrappers people train with (loadertop/wrapped.py), found on each
library's real loader where the library installs beside a CPU torch: the hook reports its
settings and the tuner changes them (issue 45: "tuning off: WebLoader has no num_workers")."""

from __future__ import annotations

import warnings

import pytest

from loadertop.wrapped import innermost, the_one_loader_inside

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


def plain(n: int = 8, **kw) -> DataLoader:
    return DataLoader(list(range(n)), batch_size=2, **kw)


def test_a_plain_loader_is_its_own_innermost():
    loader = plain()
    assert innermost(loader) is loader


def test_webdataset_webloader_is_walked_to_its_dataloader():
    wds = pytest.importorskip("webdataset")
    loader = wds.WebLoader(list(range(8)), batch_size=None, num_workers=0).batched(2)
    found = innermost(loader)
    assert isinstance(found, DataLoader) and found is loader.pipeline[0]


def test_lightnings_combined_loader_of_one_loader_is_walked_and_of_two_is_not():
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities import CombinedLoader

    one, other = plain(), plain(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lightning's own deprecation notices, not ours
        assert innermost(CombinedLoader(one, "max_size_cycle")) is one
        assert innermost(CombinedLoader({"train": one}, "sequential")) is one
        # Two loaders have no one setting to tune: the wrapper stays what it is.
        both = CombinedLoader({"a": one, "b": other}, "max_size_cycle")
        assert innermost(both) is both


def test_accelerates_prepared_loader_is_walked_to_the_loader_that_builds_its_iterators():
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    prepared = Accelerator(cpu=True).prepare(plain(num_workers=0))
    inner = innermost(prepared)
    assert inner is prepared.base_dataloader and inner is not prepared


def test_torchdatas_stateful_loader_is_a_loader_itself():
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(list(range(8)), batch_size=2)
    assert innermost(loader) is loader


def test_a_hugging_face_trainers_loader_is_walked_to_its_dataloader():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def forward(self, x=None, labels=None):
            return {"loss": self.w(x).sum()}

    data = [{"x": torch.tensor([float(i)])} for i in range(8)]
    args = TrainingArguments(output_dir="/tmp/unused", per_device_train_batch_size=2, use_cpu=True,
                             report_to=[], dataloader_num_workers=0, remove_unused_columns=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Trainer(model=Model(), args=args, train_dataset=data).get_train_dataloader()
    inner = innermost(loader)
    # Accelerate's shard around the Trainer's DataLoader: its base loader builds the iterators.
    assert type(inner) is DataLoader and inner is loader.base_dataloader


def test_timms_prefetch_loader_is_walked_to_its_dataloader():
    # timm needs torchvision, whose PyPI build fails to import beside a CPU torch on some
    # hosts ("operator torchvision::nms does not exist"): skipped there, with the reason.
    try:
        from timm.data.loader import PrefetchLoader
    except Exception as e:  # noqa: BLE001 - any import failure of timm's stack is a skip
        pytest.skip(f"timm does not import here ({type(e).__name__}: {str(e)[:80]})")
    inner = plain()
    assert innermost(PrefetchLoader(inner, device=torch.device("cpu"))) is inner


def test_the_generic_walk_is_bounded_and_finds_one_loader_or_none():
    loader = plain()

    class Holder:
        def __init__(self, *held) -> None:
            self.held = {"deep": [held]}  # four levels down: an attribute, a dict, a list, a tuple

    assert the_one_loader_inside(Holder(loader)) is loader
    assert the_one_loader_inside(Holder(loader, plain())) is None
    assert the_one_loader_inside(Holder()) is None
    # Past the walk's depth, or behind many other objects, it is not looked for.
    deep = Holder(loader)
    for _ in range(3):
        deep = Holder(deep)
    assert the_one_loader_inside(deep) is None
    crowded = Holder(*[object() for _ in range(500)], loader)
    assert the_one_loader_inside(crowded) is None
    # An object whose attribute lookup raises is not a loader, and not an error.
    class Proxy:
        def __getattr__(self, name):
            raise RuntimeError("not connected")

    assert the_one_loader_inside(Holder(Proxy(), loader)) is loader
    # A wrapper that holds itself is walked once.
    cyclic = Holder(loader)
    cyclic.me = cyclic
    assert the_one_loader_inside(cyclic) is loader
