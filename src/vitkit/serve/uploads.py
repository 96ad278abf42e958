"""Uploads: a multipart body read in memory under a size limit, then each file decoded into the
model's input, or refused with an HTTP status and a message naming the problem and the fix.

The body is read chunk by chunk and refused (413) as soon as it passes the limit (or at once,
when its Content-Length says it will), before any decoding; parts are kept in memory, never
in temporary files. A small file can decode huge (a 10 kB PNG of 9400x9400 1-bit pixels takes
350 MB as RGB), so what the files will decode to is checked from their headers before any is
decoded (`check_sizes`): at most `PixelLimits.per_image` pixels per image and `per_request` in
all (an array file's images count H x W each, from the .npy header's shape). `DecodeBudget`
bounds how many pixels are being decoded at once across requests, and `release_memory` hands
the freed memory back to the system after large decodes.

Images are decoded by `vitkit.data.image_decoder.decode_image` (the rules of every vitkit
reader, Pillow's decompression-bomb limit included) and resized by the model's `Preprocess`
(`vitkit.data.transforms.to_model_size`); `.npy`/`.npz` arrays by `vitkit.data.array_inputs`
(no pickles; `array_items`), as `vitkit predict` reads array files.

Statuses: 400 unreadable (empty, truncated, corrupt, bad multipart), 413 too big (body over the
limit, images over the pixel limits), 415 the wrong kind (not an image, an image for an array
model or an array for an image model), 422 an array whose shape or dtype does not fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import io
import math
import sys
import zipfile
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from vitkit.data import image_decoder as decoding
from vitkit.data.array_inputs import (
    ARRAY_EXTENSIONS,
    IMAGES_KEY,
    ArraysTooLarge,
    UnreadableArrayFile,
    array_items,
    is_array_file,
    read_array_images,
)
from vitkit.data.transforms import to_model_size
from vitkit.errors import ConfigError, InputError
from vitkit.preprocess import Preprocess

__all__ = ["FILE_FIELD", "DecodeBudget", "Form", "PixelLimits", "Upload", "UploadError",
           "check_sizes", "decode_files", "default_max_pixels", "read_form", "release_memory"]

FILE_FIELD = "file"
MAX_PARTS = 256  # files and fields in one body
MAX_FIELD_BYTES = 1000  # a form value (topk, layer, ...) is a few characters
NPY_MAGIC = b"\x93NUMPY"
IMAGE_KINDS = "PNG, JPEG, BMP, GIF, TIFF or WebP"
# the status of each kind of refusal of vitkit.data.image_decoder
DECODE_STATUS = {decoding.EMPTY: 400, decoding.CANNOT_OPEN: 400, decoding.NOT_AN_IMAGE: 415,
                 decoding.TRUNCATED: 400, decoding.CORRUPT: 400,
                 decoding.TOO_MANY_PIXELS: 413, decoding.UNSUPPORTED: 415}
# The default per-image limit: 16 times the model's input pixels, and never under 4096x4096
# (16.8 M pixels: a 12-megapixel photo passes; 67 MB as RGB while it is decoded)
INPUT_MULTIPLE = 16
PIXEL_FLOOR = 4096 * 4096
DECODES_IN_FLIGHT = 2  # images of the largest allowed size decoded at once, across requests
TRIM_PIXELS = 2048 * 2048  # a decode this large is followed by release_memory()


class UploadError(Exception):
    """An upload refused: `status` (4xx) and a message that says what is wrong and the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Upload:
    """One file of the body: its field name, file name, declared type and bytes."""

    field: str
    name: str
    content_type: str
    data: bytes


@dataclass
class Form:
    """A multipart body: its files in order and its other fields (last value wins)."""

    files: list[Upload] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)
    max_bytes: int | None = None  # the body's limit, also the most its arrays may expand to


class _Collector:
    """python-multipart's callbacks, gathering parts into a `Form`."""

    def __init__(self) -> None:
        self.form = Form()
        self.count = 0
        self.ended = False  # the closing boundary was read
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._data = bytearray()

    def callbacks(self) -> dict[str, Any]:
        return {"on_part_begin": self._begin, "on_part_data": self._part_data,
                "on_part_end": self._end, "on_header_field": self._field_data,
                "on_header_value": self._value_data, "on_header_end": self._header_end,
                "on_end": self._finished}

    def _finished(self) -> None:
        self.ended = True

    def _begin(self) -> None:
        self.count += 1
        if self.count > MAX_PARTS:
            raise UploadError(400, f"more than {MAX_PARTS} parts in one request: send the "
                                   "files in several requests")
        self._headers, self._data = {}, bytearray()

    def _field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).decode("latin-1").lower()] = \
            bytes(self._header_value)
        self._header_field, self._header_value = bytearray(), bytearray()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self._data += data[start:end]

    def _end(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is None:
            if len(self._data) > MAX_FIELD_BYTES:
                raise UploadError(400, f"form field {name!r} is {len(self._data)} bytes: send "
                                       f"files as file fields (curl -F {FILE_FIELD}=@PATH)")
            self.form.fields[name] = self._data.decode("utf-8", "replace")
            return
        content_type = self._headers.get("content-type", b"").decode("latin-1")
        self.form.files.append(Upload(name, filename.decode("utf-8", "replace"), content_type,
                                      bytes(self._data)))


def default_max_pixels(img_size: Sequence[int]) -> int:
    """`vitkit serve`'s default --max-pixels for a model of input `img_size` (H, W): 16 times
    its input's pixels, and at least 4096 x 4096."""
    return max(INPUT_MULTIPLE * math.prod(img_size), PIXEL_FLOOR)


@dataclass(frozen=True)
class PixelLimits:
    """The most pixels an uploaded image may decode to (`per_image`, --max-pixels), and a
    request's images together: `per_request` = `images` (--max-batch) x `per_image`."""

    per_image: int
    images: int = 8

    @classmethod
    def checked(cls, max_pixels: int | None, images: int, img_size: Sequence[int]
                ) -> PixelLimits:
        """`max_pixels` per image (None: `default_max_pixels(img_size)`, at most Pillow's
        decompression-bomb limit), refused unless a whole number from 1 to that limit."""
        bomb = decoding.pixel_limit()
        if max_pixels is None:
            max_pixels = default_max_pixels(img_size)
            max_pixels = max_pixels if bomb is None else min(max_pixels, bomb)
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
            raise ConfigError(f"max_pixels must be a whole number >= 1, got {max_pixels!r}")
        if bomb is not None and max_pixels > bomb:
            raise ConfigError(f"--max-pixels {max_pixels:,} is over Pillow's decompression-bomb "
                              f"limit of {bomb:,} pixels, which every vitkit reader keeps: give "
                              f"at most {bomb}")
        return cls(max_pixels, images)

    @property
    def per_request(self) -> int:
        return self.per_image * self.images


def _over_image_limit(name: str, size: str, pixels: int, limits: PixelLimits,
                      model_size: Sequence[int]) -> UploadError:
    return UploadError(413, f"{name} is {size} = {pixels:,} pixels, over the server's limit of "
                            f"{limits.per_image:,} pixels per image (refused before decoding): "
                            f"send a smaller image (the model sees {model_size[0]}x"
                            f"{model_size[1]}), or start the server with a larger --max-pixels")


def _check_form(form: Form, most: int | None) -> None:
    """Refuse a form without files, files under another field name, more than `most` files;
    name the nameless files."""
    stray = sorted({upload.field for upload in form.files if upload.field != FILE_FIELD})
    if stray:
        raise UploadError(400, f"files must be sent in '{FILE_FIELD}' fields, got "
                               f"{', '.join(repr(name) for name in stray)} (curl -F "
                               f"{FILE_FIELD}=@PATH)")
    if not form.files:
        raise UploadError(400, f"no file in the request: send one or more '{FILE_FIELD}' "
                               f"fields (curl -F {FILE_FIELD}=@PATH)")
    if most is not None and len(form.files) > most:
        raise UploadError(400, f"{len(form.files)} files sent, this route takes {most}")
    for index, upload in enumerate(form.files):
        upload.name = upload.name or f"upload {index}"


def _npy_values(stream: Any, size: int) -> int | None:
    """The values an .npy header (at the start of `stream`, `size` bytes in all) declares; None
    when they need more bytes than follow (damaged: the array reader says so)."""
    version = np.lib.format.read_magic(stream)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(stream)
    values = math.prod(shape)
    return values if values * dtype.itemsize <= size - stream.tell() else None


def _declared_values(upload: Upload) -> int | None:
    """How many values an array upload holds, from its .npy header (an .npz's images array:
    `IMAGES_KEY`), before any is read; None when the header cannot be read (the array
    reader then says why)."""
    try:
        if Path(upload.name).suffix.lower() != ".npz":
            return _npy_values(io.BytesIO(upload.data), len(upload.data))
        with zipfile.ZipFile(io.BytesIO(upload.data)) as archive:
            names = archive.namelist()
            name = next((n for n in (IMAGES_KEY, f"{IMAGES_KEY}.npy") if n in names), None)
            if name is None:
                return None
            with archive.open(name) as stream:
                return _npy_values(stream, archive.getinfo(name).file_size)
    except Exception:  # any damage: read_array_images names it
        return None


def check_sizes(form: Form, preprocess: Preprocess, inputs: str, limits: PixelLimits,
                most: int | None = None) -> int:
    """Refuse (413), from the files' headers and before anything is decoded, an image over
    `limits.per_image` pixels and a request whose images come to more than
    `limits.per_request` (an array file's values over the model's channels count as pixels);
    the pixels of the request's largest image (or array file, read whole), what decoding it
    will hold at once. Files that do not fit the model, or whose headers cannot be read, are
    left to `decode_files` to refuse; so are images over Pillow's decompression-bomb limit
    (with its own message)."""
    _check_form(form, most)
    bomb = decoding.pixel_limit()
    largest = total = 0
    for upload in form.files:
        if _looks_like_array(upload):
            values = _declared_values(upload) if inputs == "arrays" else None
            pixels = 0 if values is None else values // preprocess.channels
        else:
            width, height = (decoding.image_size(upload.data) if inputs == "images"
                             else None) or (0, 0)
            pixels = width * height
            if bomb is not None and pixels > bomb:
                continue  # decode_image refuses it before decoding, naming Pillow's limit
            if pixels > limits.per_image:
                raise _over_image_limit(upload.name, f"{width}x{height}", pixels, limits,
                                        preprocess.img_size)
        largest = max(largest, pixels)  # an array file is read whole
        total += pixels
        if total > limits.per_request:
            raise UploadError(413, f"the request's images, up to {upload.name}, come to "
                                   f"{total:,} pixels, over the server's limit of "
                                   f"{limits.per_request:,} per request ({limits.images} "
                                   f"images of {limits.per_image:,}: --max-batch x "
                                   "--max-pixels; refused before decoding): send fewer or "
                                   "smaller images per request, or start the server with a "
                                   "larger --max-pixels or --max-batch")
    return largest


class DecodeBudget:
    """At most `pixels` being decoded at once across requests: a request holds the pixels of
    its largest image (it decodes one image at a time) while it decodes, and waits, first come
    first served, while the others hold too many. With `DECODES_IN_FLIGHT` x --max-pixels,
    two images of the largest allowed size decode at once, or many small ones."""

    def __init__(self, pixels: int) -> None:
        self.pixels = self.free = pixels
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def held(self) -> int:
        return self.pixels - self.free

    @asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        pixels = min(pixels, self.pixels)
        if self._waiting or pixels > self.free:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((pixels, granted))
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release(pixels)  # granted just as it was cancelled
                else:
                    with contextlib.suppress(ValueError):  # not yet passed over by _grant
                        self._waiting.remove((pixels, granted))
                    self._grant()
                raise
        else:
            self.free -= pixels
        try:
            yield
        finally:
            self._release(pixels)

    def _release(self, pixels: int) -> None:
        self.free += pixels
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            pixels, granted = self._waiting.popleft()
            if granted.done():
                continue  # its request was cancelled while it waited
            self.free -= pixels
            granted.set_result(None)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent from musl
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Hand the heap's free memory back to the system: glibc's `malloc_trim(0)`, where there
    is one (elsewhere nothing). A large image is decoded in blocks that glibc keeps in the
    decoding thread's arena once freed, so without it a burst of large uploads leaves the
    server holding much of its peak (eight 4096x4096 PNGs at once: 240 MB more, for good)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _too_big(limit: int) -> UploadError:
    return UploadError(413, f"the request body is over the server's limit of "
                            f"{limit / 2**20:g} MB: send smaller or fewer files, or start the "
                            f"server with a larger --max-upload-mb")


async def read_form(request: Any, max_bytes: int) -> Form:
    """The multipart body of `request` (a Starlette request), read in memory; over
    `max_bytes` it is refused with 413 while reading, before anything is decoded."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data":
        raise UploadError(415, "send the files as multipart/form-data, one "
                               f"'{FILE_FIELD}' field per file (curl -F {FILE_FIELD}=@PATH)")
    if not options.get(b"boundary"):
        what = "an empty boundary (boundary=)" if b"boundary" in options else "no boundary"
        raise UploadError(400, f"the multipart/form-data content type names {what}: let "
                               f"the client build the body and its header (curl -F "
                               f"{FILE_FIELD}=@PATH, or requests' files=...) rather than "
                               "setting Content-Type by hand")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_big(max_bytes)
    collector = _Collector()
    collector.form.max_bytes = max_bytes
    parser = MultipartParser(options[b"boundary"], collector.callbacks())
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes:
                raise _too_big(max_bytes)
            parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise UploadError(400, f"the multipart body cannot be parsed ({exc}); send it as "
                               f"curl -F {FILE_FIELD}=@PATH does") from exc
    except ClientDisconnect:
        raise UploadError(400, "the client disconnected before the body ended") from None
    if not collector.ended:
        boundary = options[b"boundary"].decode("latin-1")
        what = ("it is empty" if received == 0 else
                f"it ends before its closing boundary (--{boundary}--): cut short, or built by "
                "hand")
        raise UploadError(400, f"the multipart body is malformed: {what}; send it as curl -F "
                               f"{FILE_FIELD}=@PATH does (or requests' files=...)")
    return collector.form


def _looks_like_array(upload: Upload) -> bool:
    return is_array_file(upload.name) or upload.data.startswith(NPY_MAGIC)


def _decode_image(upload: Upload, preprocess: Preprocess) -> torch.Tensor:
    decoded = decoding.decode_image(upload.data, preprocess.channels)
    if decoded.image is None:
        raise UploadError(DECODE_STATUS.get(decoded.kind, 400),
                          f"{upload.name}: cannot read it as an image ({decoded.reason}); "
                          f"{decoded.fix}")
    return to_model_size(decoded.image, preprocess)


def _decode_arrays(upload: Upload, preprocess: Preprocess, max_bytes: int | None = None,
                   limits: PixelLimits | None = None) -> list[tuple[str, torch.Tensor]]:
    """The images of an array upload; an .npz expanding beyond `max_bytes` is refused (413), as
    are images over `limits.per_image` pixels (before they are converted or resized)."""
    path = Path(upload.name) if is_array_file(upload.name) else Path(f"{upload.name}.npy")
    try:
        arrays = read_array_images(path, preprocess.channels, preprocess.scale,
                                   data=upload.data, img_size=preprocess.img_size,
                                   max_bytes=max_bytes)
    except ArraysTooLarge as exc:
        raise UploadError(413, f"{exc}, or start the server with a larger --max-upload-mb "
                               "(arrays may expand to the body's limit)") from exc
    except UnreadableArrayFile as exc:
        raise UploadError(400, str(exc)) from exc
    except InputError as exc:
        raise UploadError(422, str(exc)) from exc
    height, width = arrays.array.shape[-2:]
    if limits is not None and height * width > limits.per_image:
        raise _over_image_limit(f"{upload.name}[0]", f"{width}x{height}", height * width,
                                limits, preprocess.img_size)
    items = []
    for name, image in array_items(arrays, preprocess):
        if isinstance(image, str):
            raise UploadError(422, image)
        items.append((name, image))
    return items


def decode_upload(upload: Upload, preprocess: Preprocess, inputs: str,
                  max_bytes: int | None = None, limits: PixelLimits | None = None
                  ) -> list[tuple[str, torch.Tensor]]:
    """(name, (C, H, W) input at the model's size) for each image of one upload: one for an
    image, one per array image for an array file. `inputs` is what the model takes:
    "images" or "arrays" (`ModelService.inputs`); `max_bytes`: the most an array file's
    images may take in memory; `limits`: an array file's images over `limits.per_image`
    pixels are refused (an image file's size is checked by `check_sizes`)."""
    is_array = _looks_like_array(upload)
    if inputs == "images" and is_array:
        raise UploadError(415, f"{upload.name} is a numpy array file, but this model was "
                               f"trained on pictures and takes image files ({IMAGE_KINDS}): "
                               "send an image, or serve a model trained on arrays "
                               "(data=arrays)")
    if inputs == "arrays" and not is_array:
        what = "an image" if decoding.decode_image(upload.data, 3).ok \
            else "not a numpy array file"
        raise UploadError(415, f"{upload.name} is {what}, but this model was trained on "
                               f"arrays and takes {' or '.join(ARRAY_EXTENSIONS)} files of its "
                               "data's values: save the input with numpy.save(PATH, array) "
                               "and send that file")
    if is_array:
        return _decode_arrays(upload, preprocess, max_bytes, limits)
    return [(upload.name, _decode_image(upload, preprocess))]


def decode_files(form: Form, preprocess: Preprocess, inputs: str,
                 most: int | None = None, limits: PixelLimits | None = None
                 ) -> list[tuple[str, torch.Tensor]]:
    """Every file of the form's `file` fields decoded (`decode_upload`), in order; refuses a
    form without files, files under another field name, and more than `most` files; with
    `limits`, array files whose images are over `limits.per_image` (call `check_sizes`
    first: it refuses the files over the limits from their headers)."""
    _check_form(form, most)
    items: list[tuple[str, torch.Tensor]] = []
    room = form.max_bytes  # what the request's array files may still expand to
    for upload in form.files:
        decoded = decode_upload(upload, preprocess, inputs, room, limits)
        if room is not None and _looks_like_array(upload):
            room = max(room - sum(image.nbytes for _, image in decoded), 0)
        items += decoded
    return items
