"""Array files as model inputs (`vitkit predict` and `vitkit explain`): `.npy` and `.npz` files
of images, one prediction per image, the counterpart of image files for models trained on
scientific arrays (data=arrays).

- `.npy`: one image (H, W) or (C, H, W), or a batch (N, C, H, W) / (N, H, W); a 3-D array is
  one (C, H, W) image when its first axis is the model's channel count, else (N, H, W) images
  of a one-channel model. Channels-last ((H, W, C), (N, H, W, C)) is read where unambiguous:
  the last axis is the channel count and the channel axis is not. For a one-channel model, a
  3-D array whose last two axes are not the model's size (when known) and whose last axis is
  2-4 (one (H, W, C) image of other channels) is refused, naming the shape, rather than split
  into images a few pixels wide: (N, 1, H, W) says N one-channel images outright.
- `.npz`: the key `images` ((N, H, W) or (N, C, H, W), as data=arrays reads it); other keys
  (`targets`) are ignored.

Values are returned as they are (any real dtype, read safely: no pickles; `.npy` memory-mapped).
What they mean is the model's `Preprocess`: a model trained on arrays (`scale` 1) takes any
numeric dtype in its data's units; a model trained on 8-bit pictures (`scale` 255) takes
uint8 arrays only, since floats would have to be guessed into 0-255. The other way round, an
image file (8-bit, 0-255) is refused for a model trained on arrays (`image_file_refusal`),
whose units its values are not.
"""

from __future__ import annotations

import io
import logging
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from vitkit.data.sources.mapped import first_unfit
from vitkit.data.transforms import to_model_size
from vitkit.errors import InputError
from vitkit.preprocess import Preprocess

__all__ = ["ARRAY_EXTENSIONS", "PICTURE_REFUSED", "ArrayImages", "ArraysTooLarge",
           "UnreadableArrayFile", "array_items",
           "image_file_refusal", "is_array_file", "read_array_images"]

log = logging.getLogger(__name__)

ARRAY_EXTENSIONS = (".npy", ".npz")
PICTURE_REFUSED = "is an image file (8-bit values 0-255)"  # in `image_file_refusal`'s reason
IMAGES_KEY = "images"


class UnreadableArrayFile(InputError):
    """The file is not a numpy .npy/.npz file (or is damaged), as opposed to one whose arrays
    have the wrong shape or dtype for the model."""


class ArraysTooLarge(InputError):
    """The file's images would take more memory than the reader allows (`max_bytes`): a
    compressed .npz that expands beyond it."""


def is_array_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in ARRAY_EXTENSIONS

# How values in [0, 1] become the uint8 0-255 that weights of 8-bit pictures take
TO_UINT8 = "(a * 255).round().clip(0, 255).astype(numpy.uint8)"


def to_uint8_advice(dtype: str) -> str:
    """How to turn arrays of `dtype` into uint8 pictures of 0-255, for a message: floats in
    [0, 1] scaled, uint16 by its high byte (as 16-bit image files are decoded)."""
    if dtype == "uint16":
        return "for 16-bit values: (a >> 8).astype(numpy.uint8), as 16-bit images are read"
    if dtype.startswith(("float", "bfloat")):
        return f"for values in [0, 1]: {TO_UINT8}"
    return "rescaled to 0-255 first, e.g. for values in [0, 1]: " + TO_UINT8


def image_file_refusal(path: str | Path, scale: float) -> str | None:
    """Why the image file `path` (a PNG, JPEG...: 8-bit values 0-255) cannot go to a model whose
    preprocessing has `scale`, or None when it can. A model not trained on 8-bit pictures
    (`scale` other than 255; data=arrays: 1) normalises in its data's own units, so a
    picture's 0-255 would be read as those units: refused, as a float array is for a model
    trained on 8-bit pictures (and as `vitkit serve` refuses it: `Preprocess.pictures`)."""
    if scale == 255:
        return None
    return (f"{path} {PICTURE_REFUSED}, but the model was trained on arrays in its data's own "
            f"units (data=arrays: its preprocessing divides by {scale:g}, not 255), so the "
            "picture's values would be misread as those units: give the "
            f"model arrays in the units it was trained on, as a {' or '.join(ARRAY_EXTENSIONS)} "
            "file (numpy.save(PATH, array)), or use a model trained on pictures")


@dataclass
class ArrayImages:
    """The images of one array file: `array` is (N, C, H, W) (a view; memory-mapped for .npy)."""

    path: Path
    array: np.ndarray

    def __len__(self) -> int:
        return len(self.array)

    def name(self, index: int) -> str:
        """"file.npy[3]": how an image of the file is named in reports."""
        return f"{self.path}[{index}]"

    def tensor(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Images start..stop as a tensor: uint8 stays uint8, anything else float32."""
        part = np.asarray(self.array[start:stop])
        if part.dtype != np.uint8:
            unfit = first_unfit(part)
            if unfit is not None:
                raise InputError(f"{self.name(start + unfit[0])} {unfit[1]}")
            part = part.astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(part if part.flags.writeable
                                                     else part.copy()))

    def batches(self, size: int) -> Iterator[tuple[list[str], torch.Tensor]]:
        for start in range(0, len(self), size):
            stop = min(start + size, len(self))
            yield [self.name(i) for i in range(start, stop)], self.tensor(start, stop)


def _load(path: Path, data: bytes | None = None, max_bytes: int | None = None
          ) -> tuple[np.ndarray, bool]:
    """(the array, whether it is a batch by definition: an .npz's `images`), from the file at
    `path` or from its contents `data` (an upload; `path` names it); an .npz's images over
    `max_bytes` uncompressed are refused before they are read."""
    source = path if data is None else io.BytesIO(data)
    try:
        _check_declared_sizes(path, data, max_bytes)
        if path.suffix.lower() == ".npy":
            return np.load(source, mmap_mode="r" if data is None else None,
                           allow_pickle=False), False
        with np.load(source, allow_pickle=False) as archive:
            if IMAGES_KEY not in archive.files:
                held = ", ".join(archive.files) or "nothing"
                raise InputError(f"{path} has no '{IMAGES_KEY}' array (it holds {held}): save "
                                 f"the images as numpy.savez(path, {IMAGES_KEY}=...)")
            return archive[IMAGES_KEY], True
    except InputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UnreadableArrayFile(f"cannot read {path} as a numpy array file ({exc}); save it with "
                         "numpy.save or numpy.savez (no pickled objects)") from exc


def _check_declared_sizes(path: Path, data: bytes | None, max_bytes: int | None) -> None:
    """Refuse, before anything is allocated, an array whose header promises more bytes than
    its file holds (damaged: numpy would allocate them all first) and an .npz whose images
    expand beyond `max_bytes`. Memory-mapped .npy files need no check."""
    if path.suffix.lower() == ".npy":
        if data is not None:
            stream = io.BytesIO(data)
            _check_npy_header(stream, len(data), path)
        return
    with zipfile.ZipFile(io.BytesIO(data) if data is not None else path) as archive:
        names = archive.namelist()  # numpy's NpzFile takes "images", else "images.npy"
        name = next((n for n in (IMAGES_KEY, f"{IMAGES_KEY}.npy") if n in names), None)
        if name is None:
            return  # np.load names what the file holds
        member = archive.getinfo(name)
        if max_bytes is not None and member.file_size > max_bytes:
            raise ArraysTooLarge(f"{path}: its '{IMAGES_KEY}' array expands to "
                                 f"{member.file_size / 2**20:.1f} MB, over the limit of "
                                 f"{max_bytes / 2**20:g} MB: send fewer images per file")
        with archive.open(member) as stream:
            _check_npy_header(stream, member.file_size, path)


def _check_npy_header(stream: BinaryIO, size: int, path: Path) -> None:
    """Refuse an .npy (of `size` bytes in all) whose header's shape needs more bytes than follow
    it."""
    version = np.lib.format.read_magic(stream)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(stream)
    needed = math.prod(shape) * dtype.itemsize
    held = size - stream.tell()
    if needed > held:
        raise UnreadableArrayFile(f"{path} is damaged: its header says {shape} {dtype} values "
                                  f"({needed / 2**20:.1f} MB), but only {held / 2**20:.1f} MB "
                                  "follow; save the array again with numpy.save or numpy.savez")


def _refuse_one_image_of_other_channels(array: np.ndarray, img_size: Sequence[int] | None,
                                        path: Path) -> None:
    """Raise for a 3-D array (not of the model's H x W) that reads as one channels-last
    image of 2-4 channels, for a one-channel model (images 2-4 pixels wide are not meant; a
    (3, H, W) stays N = 3 images, as documented)."""
    shape = array.shape
    if not 2 <= shape[-1] <= 4:
        return
    size = f"{img_size[0]}, {img_size[1]}" if img_size is not None else "H, W"
    raise InputError(f"{path}: the array {shape} looks like one image of {shape[-1]} channels "
                     "(H, W, C): channels-last, but the model takes one-channel images, "
                     f"(C, H, W) = (1, {size}); give one-channel images: (H, W) or (1, H, W) "
                     "for one image (e.g. the channel the model was trained on), (N, 1, H, W) "
                     "for N images of H x W")


def _as_nchw(array: np.ndarray, channels: int, batch: bool, path: Path,
             img_size: Sequence[int] | None = None) -> np.ndarray:
    """(N, C, H, W) of an array by the rules in the module docstring (`img_size`: the model's
    (H, W), where known)."""
    shape = array.shape
    rules = ("(N, H, W) or (N, C, H, W)" if batch else
             "(H, W), (C, H, W), (N, H, W) or (N, C, H, W)")
    if array.ndim not in ((3, 4) if batch else (2, 3, 4)):
        raise InputError(f"{path}: images must be {rules}, got {array.ndim} dimensions "
                         f"{shape}")
    if array.ndim == 2:
        if channels != 1:
            raise InputError(f"{path}: a 2-D array {shape} is one channel, but the model takes "
                             f"{channels}; give (C, H, W) with C = {channels}")
        return array[None, None]
    if array.ndim == 3:
        if not batch and shape[0] == channels:
            return array[None]  # one (C, H, W) image
        if channels == 1:
            if not batch and (img_size is None or tuple(shape[1:]) != tuple(img_size)):
                if shape[-1] == 1:
                    return np.moveaxis(array, -1, 0)[None]  # one (H, W, 1) image
                _refuse_one_image_of_other_channels(array, img_size, path)
            return array[:, None]  # (N, H, W)
        if not batch and shape[-1] == channels:
            return np.moveaxis(array, -1, 0)[None]  # one (H, W, C) image
        raise InputError(f"{path}: cannot tell the channel axis of {shape} for a model of "
                         f"{channels} channels; give {'(N, C, H, W)' if batch else '(C, H, W)'}"
                         f" with C = {channels}")
    if shape[1] == channels:
        return array
    if shape[-1] == channels:
        return np.moveaxis(array, -1, 1)  # (N, H, W, C)
    raise InputError(f"{path}: images {shape} have no axis of {channels} channel(s) (the "
                     f"model's); give (N, {channels}, H, W)")


def read_array_images(path: str | Path, channels: int, scale: float = 1.0,
                      data: bytes | None = None,
                      img_size: Sequence[int] | None = None,
                      max_bytes: int | None = None) -> ArrayImages:
    """The images of an .npy or .npz file for a model of `channels` input channels whose
    preprocessing has `scale` (255: trained on 8-bit pictures, which takes uint8 only); `data`:
    the file's contents, read from memory (`path` then only names the file and its kind);
    `img_size`: the model's (H, W), to tell N one-channel images from one image of several
    channels (without it only channels-last shapes are told apart).
    `max_bytes`: the most an .npz's images may expand to (`ArraysTooLarge` beyond it).
    Raises `UnreadableArrayFile` for a file numpy cannot read (or damaged), `InputError` for
    arrays that do not fit the model."""
    path = Path(path)
    array, batch = _load(path, data, max_bytes)
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
            or array.dtype == np.bool_):
        raise InputError(f"{path}: images must be numbers, got dtype {array.dtype}")
    if scale != 1.0 and array.dtype != np.uint8:
        raise InputError(
            f"{path} holds {array.dtype} values, but the model was trained on 8-bit pictures "
            f"(its preprocessing divides by {scale:g}): give uint8 arrays of 0-255 "
            f"({to_uint8_advice(str(array.dtype))}), or use a model "
            "trained on arrays (data=arrays), which takes values in its data's own units")
    images = _as_nchw(array, channels, batch, path, img_size)
    if len(images) == 0:
        raise InputError(f"{path} holds no images (shape {array.shape})")
    return ArrayImages(path, images)


def array_items(arrays: ArrayImages, preprocess: Preprocess
                ) -> Iterator[tuple[str, torch.Tensor | str]]:
    """("file.npy[i]", (C, H, W) image at the model's size) per image of an array file read
    by `read_array_images`, or (that name, why the image cannot be used: NaN or inf). Images
    of another size are resized (`vitkit.data.transforms.to_model_size`; logged once)."""
    size = tuple(arrays.array.shape[-2:])
    if size != tuple(preprocess.img_size):
        log.info("%s: images are %dx%d and the model takes %dx%d: resizing them (bilinear, "
                 "antialiased when shrinking)", arrays.path, *size, *preprocess.img_size)
    for index in range(len(arrays)):
        try:
            image = arrays.tensor(index, index + 1)
        except InputError as exc:
            yield arrays.name(index), str(exc)
            continue
        yield arrays.name(index), to_model_size(image, preprocess)[0]
