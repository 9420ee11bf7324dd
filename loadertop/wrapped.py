"""How wrappers keep the DataLoader they wrap, read in the trainer by the hook (the loader's
settings it reports) and by the in-place tuner (the settings it changes). Standard library only,
and torch is never imported: a loader is known by its settings.

Accelerate's DataLoaderShard keeps it in `base_dataloader` (a DataLoader itself, whose settings
are not the ones that build its iterators); timm's PrefetchLoader in `loader`, others in
`dataloader`; webdataset's WebLoader is a pipeline whose first stage is the DataLoader.
"""

from __future__ import annotations

_ALWAYS_INNER = ("base_dataloader",)
_INNER = ("loader", "dataloader", "_loader", "_dataloader")
_SETTINGS = ("num_workers", "prefetch_factor", "persistent_workers", "dataset")


def looks_like_a_loader(x) -> bool:
    """It has a torch DataLoader's settings (by duck type)."""
    return all(hasattr(x, a) for a in _SETTINGS)


def innermost(loader):
    """The DataLoader whose settings build its iterators, through the wrappers around it."""
    for _ in range(8):
        own = getattr(loader, "__dict__", {})
        inner = next((own[a] for a in _ALWAYS_INNER if a in own), None)
        if inner is None and not looks_like_a_loader(loader):
            inner = next((own[a] for a in _INNER if a in own and looks_like_a_loader(own[a])), None)
            pipeline = own.get("pipeline")  # webdataset's WebLoader: DataLoader, then its stages
            if inner is None and isinstance(pipeline, list) and pipeline and looks_like_a_loader(pipeline[0]):
                inner = pipeline[0]
        if inner is None:
            return loader
        loader = inner
    return loader
