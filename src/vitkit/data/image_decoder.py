"""The one image decoder: a file becomes an 8-bit grayscale or RGB PIL image, or a named reason.

Every reader of image files (the folder loader, `predict`, `explain`, Hugging Face datasets,
whose images arrive as bytes) goes through here, so an image is converted the same way
everywhere. The rules:

* EXIF orientation is applied (as `PIL.ImageOps.exif_transpose`): photos come out upright.
* Transparency (RGBA, LA, palette or colour-key transparency) is composited on white
  (`BACKGROUND`): a transparent pixel becomes white, a half-transparent one half-way to white.
* 16-bit samples keep their high byte (v >> 8, so 65535 -> 255 and 32896 -> 128), as
  torchvision's `to_dtype(..., scale=True)` does and as Pillow itself reduces 16-bit colour
  PNGs; they are scaled, never clipped.
* CMYK becomes RGB by Pillow's formula R = (255 - C)(255 - K) / 255 (likewise G, B); ICC
  profiles are not applied (pixels as stored).
* Grayscale for a 3-channel model is copied to R, G and B; colour for a 1-channel model
  becomes ITU-R 601-2 luma (Pillow's convert("L")).
* Multi-frame files (GIF, TIFF, WebP) give their first frame.

Refused, with the kind of problem and the fix: empty files, files that are not images (a text
file named .png), truncated or corrupt data, images over Pillow's decompression-bomb limit
(`PIL.Image.MAX_IMAGE_PIXELS`), and pixel formats with no 8-bit meaning (floating point).
`image_size` reads the size a file declares without decoding it, for callers that cap what
they decode below that limit (`vitkit serve --max-pixels`).
"""

from __future__ import annotations

import io
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from vitkit.errors import InputError

__all__ = [
    "BACKGROUND",
    "FIXES",
    "DecodedImage",
    "ImageSource",
    "decode_image",
    "image_size",
    "open_image",
    "pixel_limit",
]

BACKGROUND = (255, 255, 255)  # what transparent pixels are composited on: white

# The kinds of refusal, each with the advice a user needs (keys appear in skip lists and logs).
EMPTY = "empty file"
CANNOT_OPEN = "cannot open"
NOT_AN_IMAGE = "not an image"
TRUNCATED = "truncated"
CORRUPT = "corrupt"
TOO_MANY_PIXELS = "too many pixels"
UNSUPPORTED = "unsupported pixel format"
FIXES = {
    EMPTY: "the file has 0 bytes: copy or download it again",
    CANNOT_OPEN: "check that the path is a readable file",
    NOT_AN_IMAGE: "pass image files Pillow can decode (PNG, JPEG, BMP, GIF, TIFF, WebP), or "
                  "remove the file",
    TRUNCATED: "the file was cut short (an interrupted download or copy?): fetch it again",
    CORRUPT: "the file is damaged: fetch or export it again",
    TOO_MANY_PIXELS: "shrink the image below Pillow's decompression-bomb limit (in Python, "
                     "for a file you trust, raise PIL.Image.MAX_IMAGE_PIXELS first; None "
                     "disables the check)",
    UNSUPPORTED: "save the image as 8- or 16-bit grayscale or RGB",
}

# A file path, or an image file's contents (bytes, or a binary file object open for reading).
ImageSource = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO

_ALPHA_MODES = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})
_SIXTEEN_BIT_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
_TRANSPOSED_ORIENTATIONS = frozenset(range(2, 9))  # EXIF orientations exif_transpose turns
_SIGNATURES = {  # file starts that name a format, for "damaged header" vs "not an image"
    b"\x89PNG": "PNG", b"\xff\xd8": "JPEG", b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


class _Refused(Exception):
    """Internal: a file refused with a kind (a key of FIXES) and a detail."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class DecodedImage:
    """A decoded 8-bit image (`image`, mode "L" or "RGB"), or why the file was refused."""

    image: Image.Image | None = None
    kind: str = ""  # the kind of refusal, a key of FIXES; "" when decoded
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.image is not None

    @property
    def reason(self) -> str:
        """"kind: detail", e.g. "truncated: image file is truncated"; "" when decoded."""
        return f"{self.kind}: {self.detail}" if self.kind else ""

    @property
    def fix(self) -> str:
        return FIXES.get(self.kind, "")


def _check_channels(channels: int) -> str:
    if channels not in (1, 3):
        raise InputError(f"image files decode to 1 (grayscale) or 3 (RGB) channels, not "
                         f"{channels}; use a model with in_chans 1 or 3 for image files, or "
                         f"feed it tensors")
    return "L" if channels == 1 else "RGB"


def _describe_unidentified(head: bytes) -> _Refused:
    for magic, name in _SIGNATURES.items():
        if head.startswith(magic):
            return _Refused(CORRUPT, f"starts like a {name} file but its header is damaged or "
                                     f"cut short")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and all(ch.isprintable() or ch.isspace() for ch in text):
        return _Refused(NOT_AN_IMAGE, f"the file is text ({text[:24].strip()!r}...), not an "
                                      f"image")
    return _Refused(NOT_AN_IMAGE, "no image format recognised")


def _error_detail(err: BaseException, path: str) -> str:
    text = str(err)
    if path:  # Pillow names the file in some messages; the caller names it already
        text = text.replace(repr(path), "").replace(path, "")
    text = text.strip().rstrip(":").strip()
    return text or type(err).__name__


def _check_pixels(image: Image.Image, max_pixels: int | None) -> None:
    pixels = image.width * image.height
    if max_pixels is not None and pixels > max_pixels:
        raise _Refused(TOO_MANY_PIXELS, f"{image.width}x{image.height} = {pixels:,} pixels is "
                                        f"over Pillow's decompression-bomb limit of "
                                        f"{max_pixels:,}")
    if pixels == 0:
        raise _Refused(CORRUPT, f"the image is {image.width}x{image.height}: no pixels")


def _sixteen_to_eight(image: Image.Image) -> Image.Image:
    """16-bit samples (mode I or I;16*) -> mode L, keeping the high byte (v >> 8)."""
    samples = np.asarray(image)
    if samples.size and (int(samples.min()) < 0 or int(samples.max()) > 65535):
        raise _Refused(UNSUPPORTED, f"32-bit integer pixels ({int(samples.min())} .. "
                                    f"{int(samples.max())}) have no standard 8-bit scale")
    return Image.fromarray((samples.astype(np.uint32) >> 8).astype(np.uint8), mode="L")


def _has_transparency(image: Image.Image) -> bool:
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        return True
    palette = image.palette if image.mode == "P" else None
    return palette is not None and palette.mode.endswith("A")


def _to_target(image: Image.Image, mode: str) -> Image.Image:
    """An 8-bit image in `mode` ("L" or "RGB") by the module's rules."""
    if image.mode in _SIXTEEN_BIT_MODES:
        image = _sixteen_to_eight(image)
    elif image.mode == "F":
        raise _Refused(UNSUPPORTED, "floating-point pixels (mode F) have no standard 8-bit "
                                    "scale")
    if _has_transparency(image):
        backdrop = Image.new("RGBA", image.size, (*BACKGROUND, 255))
        image = Image.alpha_composite(backdrop, image.convert("RGBA"))
    if image.mode not in ("L", "RGB"):
        try:
            image = image.convert("RGB")  # CMYK, YCbCr, palette, 1-bit, RGBA after compositing
        except ValueError as err:
            raise _Refused(UNSUPPORTED, f"mode {image.mode} cannot be converted to RGB "
                                        f"({err})") from err
    return image if image.mode == mode else image.convert(mode)


def _upright(image: Image.Image) -> Image.Image:
    """`ImageOps.exif_transpose(image)`, but `image` itself when its EXIF orientation is absent
    or 1 (most files), sparing exif_transpose's copy of the decoded pixels."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) not in _TRANSPOSED_ORIENTATIONS:
        return image
    return ImageOps.exif_transpose(image)


def _open_source(source: ImageSource) -> tuple[str | io.BytesIO, bytes, str]:
    """What Pillow opens (a path, or the bytes in memory), the first bytes, and the path ("" for
    bytes), refusing empty or unreadable sources."""
    if isinstance(source, (bytes, bytearray, memoryview)) or hasattr(source, "read"):
        try:
            data = bytes(source) if not hasattr(source, "read") else source.read()
        except OSError as err:
            raise _Refused(CANNOT_OPEN, err.strerror or type(err).__name__) from err
        if not data:
            raise _Refused(EMPTY, "0 bytes")
        return io.BytesIO(data), data[:32], ""
    path = str(source)
    try:  # one read of the whole file: no second open, stat or small reads while decoding
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise _Refused(CANNOT_OPEN, err.strerror or type(err).__name__) from err
    if not data:
        raise _Refused(EMPTY, "0 bytes")
    return io.BytesIO(data), data[:32], path


def _decode(source: ImageSource, mode: str, max_pixels: int | None) -> Image.Image:
    opened, head, path = _open_source(source)
    try:
        with Image.open(opened) as image:
            _check_pixels(image, max_pixels)
            image.load()  # decodes the whole first frame: truncation and corruption show here
            result = _to_target(_upright(image), mode)
            return result.copy() if result is image else result
    except _Refused:
        raise
    except Image.DecompressionBombError as err:  # over twice the limit: raised by Pillow
        count = re.search(r"\((\d+) pixels\)", str(err))
        detail = (f"{int(count.group(1)):,} pixels is over Pillow's decompression-bomb limit "
                  f"of {max_pixels:,}" if count and max_pixels else _error_detail(err, path))
        raise _Refused(TOO_MANY_PIXELS, detail) from err
    except UnidentifiedImageError as err:
        raise _describe_unidentified(head) from err
    except MemoryError as err:
        raise _Refused(TOO_MANY_PIXELS, "not enough memory to decode it") from err
    except Exception as err:  # Pillow raises many types for damaged files; each means "refuse"
        detail = _error_detail(err, path)
        kind = TRUNCATED if "truncated" in detail.lower() else CORRUPT
        if kind == CORRUPT and not isinstance(err, (OSError, SyntaxError, ValueError)):
            detail = f"{type(err).__name__}: {detail}"
        raise _Refused(kind, detail) from err


def decode_image(path: ImageSource, channels: int = 3) -> DecodedImage:
    """Decode `path` to an 8-bit image with `channels` (1: mode "L", 3: "RGB"), or say why not.

    `path` is a file path, or the file's contents as bytes or a binary file object (an image
    stored inside a dataset): the same rules and refusals apply to each.
    Never raises for a bad file: the result carries the kind of problem and a detail. Images
    over `PIL.Image.MAX_IMAGE_PIXELS` are refused (Pillow only warns up to twice that); its
    warnings are silenced, since the result says it all.
    """
    mode = _check_channels(channels)
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bomb, palette and EXIF warnings: we decide here
            return DecodedImage(image=_decode(path, mode, limit))
    except _Refused as refused:
        return DecodedImage(kind=refused.kind, detail=refused.detail)


def pixel_limit() -> int | None:
    """The decompression-bomb limit every reader keeps: `PIL.Image.MAX_IMAGE_PIXELS` as it is
    now (None: no limit); images over it are refused by `decode_image`."""
    return Image.MAX_IMAGE_PIXELS


def image_size(path: ImageSource) -> tuple[int, int] | None:
    """(width, height) that an image file declares in its header, read without decoding a
    pixel (Pillow's `Image.open` reads the header only), so that a caller can refuse a file
    that is small on disk but huge decoded before `decode_image` allocates it. For a
    multi-frame file (GIF, TIFF, WebP, APNG) the first frame's, the one `decode_image` decodes
    (the others are never decoded, so their count does not matter). None when the file does
    not open as an image, or is over twice `pixel_limit()` (Pillow refuses to open it):
    `decode_image` then says why."""
    try:
        opened, _, _ = _open_source(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(opened) as image:
                return image.size
    except Exception:  # _Refused, unidentified, damaged header, bomb: decode_image says which
        return None


def open_image(path: str | Path, channels: int = 3) -> Image.Image:
    """The 8-bit image in `path` (mode "L" for 1 channel, "RGB" for 3), upright, on white.

    Raises `InputError` naming the file, the problem and the fix when it cannot be decoded.
    """
    decoded = decode_image(path, channels)
    if decoded.image is None:
        raise InputError(f"cannot read {path} as an image ({decoded.reason}); {decoded.fix}")
    return decoded.image
