"""How wrappers keep the DataLoader they wrap, read in the trainer by the hook (the loader's
settings it reports) and by the in-place tuner (the settings it changes). Standard library only,
and torch is never imported: a loader is known by its settings.

Accelerate's DataLoaderShard keeps it in `base_dataloader` (a DataLoader itself, whose settings
are not the ones that build its iterators); timm's PrefetchLoader in `loader`, others in
`dataloader`; webdataset's WebLoader is a pipeline whose first stage is the DataLoader.
Past those known places, a short walk of the wrapper's attributes (and the lists, tuples and
dicts they hold) finds a loader kept anywhere else (Lightning's CombinedLoader keeps its one
loader in `_flattened`): taken only where exactly one is found, since a wrapper of several
loaders has no one setting to tune.
"""

from __future__ import annotations

_ALWAYS_INNER = ("base_dataloader",)
_INNER = ("loader", "dataloader", "_loader", "_dataloader")
_SETTINGS = ("num_workers", "prefetch_factor", "persistent_workers", "dataset")
# The generic walk: how deep into attributes and containers, and how many objects at most, so
# that a wrapper holding a model or a large list costs a few microseconds, not a graph search.
_WALK_DEPTH = 4  # an attribute, then a dict, a list and a tuple inside it
_WALK_OBJECTS = 200


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
                inner = the_one_loader_inside(loader)
        if inner is None:
            return loader
        loader = inner
    return loader


def the_one_loader_inside(wrapper):
    """The single loader held in the wrapper's attributes (breadth first, bounded), or None
    where there is none or more than one."""
    found: list = []
    seen = {id(wrapper)}
    level = [wrapper]
    visited = 0
    for _ in range(_WALK_DEPTH):
        below = []
        for obj in level:
            for child in _held(obj):
                if id(child) in seen or isinstance(child, (str, bytes, int, float, bool, type(None))):
                    continue
                seen.add(id(child))
                visited += 1
                if visited > _WALK_OBJECTS:
                    return None  # a second loader may lie past the cap: not one to take
                if _is_a_loader(child):
                    found.append(child)  # not walked into: what it holds is its own
                    if len(found) > 1:
                        return None
                else:
                    below.append(child)
        level = below
    return found[0] if len(found) == 1 else None


def _is_a_loader(x) -> bool:
    """looks_like_a_loader, for any object a wrapper holds: an attribute lookup that raises
    (a proxy, a lazy handle) makes it not a loader, never an error in the user's loop."""
    try:
        return looks_like_a_loader(x)
    except Exception:
        return False


def _held(obj) -> list:
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple)):
        return list(obj)
    own = getattr(obj, "__dict__", None)
    if not isinstance(own, dict) or isinstance(obj, type):
        return []
    return list(own.values())
