"""Uploads: a multipart body read in memory under a size limit, then each file decoded into the
model's input, or refused with an HTTP status and a message naming the problem and the fix.

The body is read chunk by chunk and refused (413) as soon as it passes the limit (or at once,
when its Content-Length says it will), before any decoding; parts are kept in memory, never
in temporary files. Images are decoded by `vitkit.data.image_decoder.decode_image` (the rules of
every vitkit reader, Pillow's decompression-bomb limit included) and resized by the model's
`Preprocess` (`vitkit.data.transforms.to_model_size`); `.npy`/`.npz` arrays by
`vitkit.data.array_inputs` (no pickles; `array_items`), as `vitkit predict` reads array files.

Statuses: 400 unreadable (empty, truncated, corrupt, bad multipart), 413 too big (body over the
limit, image over the pixel limit), 415 the wrong kind (not an image, an image for an array
model or an array for an image model), 422 an array whose shape or dtype does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from vitkit.data import image_decoder as decoding
from vitkit.data.array_inputs import (
    ARRAY_EXTENSIONS,
    ArraysTooLarge,
    UnreadableArrayFile,
    array_items,
    is_array_file,
    read_array_images,
)
from vitkit.data.transforms import to_model_size
from vitkit.errors import InputError
from vitkit.preprocess import Preprocess

__all__ = ["FILE_FIELD", "Form", "Upload", "UploadError", "decode_files", "read_form"]

FILE_FIELD = "file"
MAX_PARTS = 256  # files and fields in one body
MAX_FIELD_BYTES = 1000  # a form value (topk, layer, ...) is a few characters
NPY_MAGIC = b"\x93NUMPY"
IMAGE_KINDS = "PNG, JPEG, BMP, GIF, TIFF or WebP"
# the status of each kind of refusal of vitkit.data.image_decoder
DECODE_STATUS = {decoding.EMPTY: 400, decoding.CANNOT_OPEN: 400, decoding.NOT_AN_IMAGE: 415,
                 decoding.TRUNCATED: 400, decoding.CORRUPT: 400,
                 decoding.TOO_MANY_PIXELS: 413, decoding.UNSUPPORTED: 415}


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
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._data = bytearray()

    def callbacks(self) -> dict[str, Any]:
        return {"on_part_begin": self._begin, "on_part_data": self._part_data,
                "on_part_end": self._end, "on_header_field": self._field_data,
                "on_header_value": self._value_data, "on_header_end": self._header_end}

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
    if b"boundary" not in options:
        raise UploadError(400, "the multipart/form-data content type names no boundary: let "
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


def _decode_arrays(upload: Upload, preprocess: Preprocess, max_bytes: int | None = None
                   ) -> list[tuple[str, torch.Tensor]]:
    """The images of an array upload; an .npz expanding beyond `max_bytes` is refused (413)."""
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
    items = []
    for name, image in array_items(arrays, preprocess):
        if isinstance(image, str):
            raise UploadError(422, image)
        items.append((name, image))
    return items


def decode_upload(upload: Upload, preprocess: Preprocess, inputs: str,
                  max_bytes: int | None = None) -> list[tuple[str, torch.Tensor]]:
    """(name, (C, H, W) input at the model's size) for each image of one upload: one for an
    image, one per array image for an array file. `inputs` is what the model takes:
    "images" or "arrays" (`ModelService.inputs`); `max_bytes`: the most an array file's
    images may take in memory."""
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
        return _decode_arrays(upload, preprocess, max_bytes)
    return [(upload.name, _decode_image(upload, preprocess))]


def decode_files(form: Form, preprocess: Preprocess, inputs: str,
                 most: int | None = None) -> list[tuple[str, torch.Tensor]]:
    """Every file of the form's `file` fields decoded (`decode_upload`), in order; refuses a
    form without files, files under another field name, and more than `most` files."""
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
    items: list[tuple[str, torch.Tensor]] = []
    room = form.max_bytes  # what the request's array files may still expand to
    for index, upload in enumerate(form.files):
        upload.name = upload.name or f"upload {index}"
        decoded = decode_upload(upload, preprocess, inputs, room)
        if room is not None and _looks_like_array(upload):
            room = max(room - sum(image.nbytes for _, image in decoded), 0)
        items += decoded
    return items
