"""Real image files for the built-in job: JPEGs written once, decoded by PIL in the workers.

A real image pipeline's workers do not compute evenly: each item is a burst of decoding
(libjpeg), cropping and resizing, then the worker waits for the next index. This module
gives the built-in job such items: `write_images` writes N photo-like JPEGs (smooth
gradients and noise, so that they compress as photos do) once into a folder, and
`decode` turns one into a CHW uint8 tensor, as torchvision's RandomResizedCrop,
RandomHorizontalFlip and ToTensor do. Needs Pillow (the test extras); imports torch.
"""

from __future__ import annotations

import io
import os
import random

import torch

from ..files import own_folder, write_atomic

SIDE = 224  # the crop the model sees, as ImageNet's


class UnsafeFolder(OSError):
    """The image folder is not this user's own: writing there could overwrite another's files."""


def private_folder(folder: str) -> str:
    """folder, made or checked as this user's own: a real directory (not a link), owned by
    the user who writes into it, that no one else may write to. Another user who made it
    first (the default lives in the shared /tmp) could plant links where the images go."""
    if not own_folder(folder, 0o022):
        raise UnsafeFolder(f"{folder} is not a folder of this user's that only it may write to: "
                           "remove it, or give --image-dir a folder of your own")
    return folder


def write_images(folder: str, count: int, width: int = 500, height: int = 375) -> list[str]:
    """`count` JPEGs in `folder` (kept between runs: the same files for every setting)."""
    from PIL import Image, ImageFilter

    private_folder(folder)
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"img-{width}x{height}-{i:05d}.jpg")
        paths.append(path)
        if os.path.exists(path):
            continue
        rng = random.Random(i)
        small = Image.frombytes("RGB", (width // 8, height // 8),
                                bytes(rng.randrange(256) for _ in range((width // 8) * (height // 8) * 3)))
        image = small.resize((width, height), Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(1.5))
        grain = Image.effect_noise((width, height), 24).convert("RGB")
        image = Image.blend(image, grain, 0.15)
        jpeg = io.BytesIO()
        image.save(jpeg, "JPEG", quality=90)
        write_atomic(path, jpeg.getvalue())  # a temp file of its own (O_EXCL), never through a link
    return paths


def decode(path: str, seed: int) -> torch.Tensor:
    """One training sample: decode, a random crop of 8-100 % of the area, resized to
    224 x 224, a random flip, as bytes (CHW uint8: the step normalises, as on a GPU)."""
    from PIL import Image

    rng = random.Random(seed)
    with Image.open(path) as f:
        image = f.convert("RGB")
    w, h = image.size
    area = w * h * rng.uniform(0.08, 1.0)
    side = min(w, h, max(8, int(area**0.5)))
    left, top = rng.randrange(w - side + 1), rng.randrange(h - side + 1)
    image = image.resize((SIDE, SIDE), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(SIDE, SIDE, 3)
    return pixels.permute(2, 0, 1).contiguous()
