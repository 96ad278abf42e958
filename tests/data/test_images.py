"""The one image decoder (`vitkit.data.image_decoder`): each kind of file converted right or refused
with a named reason whose advice works; predict and explain read files through it."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.analysis.inputs import images_from_files
from vitkit.data.image_decoder import BACKGROUND, FIXES, decode_image, open_image
from vitkit.errors import InputError
from vitkit.preprocess import Preprocess


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _pixels(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (h, w) if channels == 1 else (h, w, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _png_bytes(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


def _decoded(path: Path, channels: int = 3) -> np.ndarray:
    decoded = decode_image(path, channels)
    assert decoded.ok, decoded.reason
    return np.asarray(decoded.image)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _raw_png(width: int, height: int, bit_depth: int, color_type: int, rows: bytes = b"") -> bytes:
    """A PNG written by hand (not by Pillow): header, optional pixel rows, end."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    body = _chunk(b"IDAT", zlib.compress(rows)) if rows else b""
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + body + _chunk(b"IEND", b"")


# -- refused, with a reason and advice that works -----------------------------------------------

def test_zero_byte_file_refused_then_fixed(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    decoded = decode_image(path)
    assert not decoded.ok and decoded.kind == "empty file"
    says(decoded.reason, "empty file", "0 bytes")
    with pytest.raises(InputError) as caught:
        open_image(path)
    says(str(caught.value), "empty.png", "empty file", "0 bytes", "copy or download it again")
    original = _pixels(4, 5)
    path.write_bytes(_png_bytes(Image.fromarray(original)))  # the advice: copy it again
    assert np.array_equal(np.asarray(open_image(path)), original)


def test_text_file_named_png_is_not_an_image(tmp_path: Path) -> None:
    path = tmp_path / "labels.png"
    path.write_text("cat,dog\n1,0\n")
    decoded = decode_image(path)
    assert decoded.kind == "not an image"
    says(decoded.detail, "text", "'cat,dog\\n1,0'", "not an image")
    with pytest.raises(InputError) as caught:
        open_image(path)
    says(str(caught.value), "labels.png", "not an image", "image files Pillow can decode")
    random_bytes = tmp_path / "noise.jpg"
    random_bytes.write_bytes(np.random.default_rng(0).bytes(300))
    refused = decode_image(random_bytes)
    assert refused.kind == "not an image"
    says(refused.reason, "no image format recognised")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file_refused_and_refetched(tmp_path: Path, fmt: str) -> None:
    original = _pixels(48, 40, seed=3)
    buffer = io.BytesIO()
    Image.fromarray(original).save(buffer, format=fmt)
    full = buffer.getvalue()
    path = tmp_path / f"photo.{fmt.lower()}"
    path.write_bytes(full[: len(full) // 2])
    decoded = decode_image(path)
    assert decoded.kind == "truncated" and "truncated" in decoded.detail
    assert "fetch it again" in decoded.fix
    path.write_bytes(full[:4])  # cut inside the header: Pillow cannot even identify it
    header_cut = decode_image(path)
    assert header_cut.kind == "corrupt"
    says(header_cut.reason, fmt, "header", "damaged or cut short")
    path.write_bytes(full)  # the advice: fetch it again
    expected = original if fmt == "PNG" else np.asarray(Image.open(io.BytesIO(full)))
    assert np.array_equal(_decoded(path), expected)


def test_corrupt_jpeg_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(_pixels(16, 16)).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    huffman = data.find(b"\xff\xc4")  # the first Huffman table: overwritten with 0xff bytes
    data[huffman + 4:huffman + 20] = b"\xff" * 16
    path = tmp_path / "bad.jpg"
    path.write_bytes(bytes(data))
    decoded = decode_image(path)
    assert decoded.kind == "corrupt"
    says(decoded.detail, "broken data stream")


def test_decompression_bomb_refused_without_warnings(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    huge = tmp_path / "huge.png"  # a header claiming 10^10 pixels: Pillow raises at open
    huge.write_bytes(_raw_png(100_000, 100_000, 8, 2))
    large = tmp_path / "large.png"  # 10^8 pixels: over the limit, where Pillow only warns
    large.write_bytes(_raw_png(10_000, 10_000, 8, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused_huge, refused_large = decode_image(huge), decode_image(large)
    assert caught == []
    assert refused_huge.kind == refused_large.kind == "too many pixels"
    limit = Image.MAX_IMAGE_PIXELS
    says(refused_huge.detail, "10,000,000,000 pixels", "decompression-bomb", f"{limit:,}")
    says(refused_large.detail, "10000x10000", "100,000,000 pixels", "decompression-bomb",
         f"{limit:,}")
    # A real small image under a lowered limit; the advice (raise the limit) makes it load.
    path = tmp_path / "small.png"
    original = _pixels(12, 12)
    path.write_bytes(_png_bytes(Image.fromarray(original)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(InputError) as caught:
        open_image(path)
    says(str(caught.value), "12x12", "144 pixels", "raise PIL.Image.MAX_IMAGE_PIXELS")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert np.array_equal(np.asarray(open_image(path)), original)


def test_floating_point_pixels_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "depth.tif"
    Image.fromarray(np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)).save(path)
    decoded = decode_image(path)
    assert decoded.kind == "unsupported pixel format" and "mode F" in decoded.detail


def test_channels_other_than_gray_or_rgb(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    Image.fromarray(_pixels(2, 2)).save(path)
    with pytest.raises(InputError) as caught:
        decode_image(path, channels=4)
    says(str(caught.value), "1 (grayscale)", "3 (RGB)", "not 4")


# -- converted correctly --------------------------------------------------------------------

def test_sixteen_bit_gray_png_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "g16.png"
    Image.fromarray(np.array([[0, 255, 1000, 32896, 65535]], dtype=np.uint16)).save(path)
    assert _decoded(path, 1).tolist() == [[0, 0, 3, 128, 255]]  # v >> 8; clipping gave 255s
    rgb = _decoded(path, 3)
    assert rgb[0, :, 0].tolist() == [0, 0, 3, 128, 255] and (rgb == rgb[..., :1]).all()


@pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")
def test_sixteen_bit_pngs_match_torchvision(tmp_path: Path) -> None:
    """Gray (written by Pillow) and RGB (written by hand) 16-bit PNGs decode as torchvision's
    own PNG decoder followed by its uint16 -> uint8 `to_dtype(scale=True)`."""
    tv_io = pytest.importorskip("torchvision.io")
    from torchvision.transforms.v2.functional import to_dtype

    rng = np.random.default_rng(7)
    gray = rng.integers(0, 65536, (6, 7), dtype=np.uint16)
    Image.fromarray(gray).save(tmp_path / "gray.png")
    rgb = rng.integers(0, 65536, (5, 4, 3), dtype=np.uint16)
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in rgb)
    (tmp_path / "rgb.png").write_bytes(_raw_png(4, 5, 16, 2, rows))
    for name, channels in (("gray.png", 1), ("rgb.png", 3)):
        raw = tv_io.decode_png(tv_io.read_file(str(tmp_path / name)),
                               mode=tv_io.ImageReadMode.UNCHANGED)
        assert raw.dtype == torch.uint16
        expected = to_dtype(raw, torch.uint8, scale=True).permute(1, 2, 0).squeeze(-1).numpy()
        assert np.array_equal(_decoded(tmp_path / name, channels), expected), name


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path) -> None:
    """Four 8x8 CMYK patches (one JPEG block each); RGB = (255 - C)(255 - K) / 255 etc.,
    within JPEG tolerance (8 levels)."""
    cmyk = np.zeros((8, 32, 4), dtype=np.uint8)
    colours = [(0, 255, 255, 0), (255, 0, 0, 0), (0, 0, 0, 128), (40, 90, 200, 30)]
    for i, colour in enumerate(colours):
        cmyk[:, 8 * i:8 * (i + 1)] = colour
    path = tmp_path / "cmyk.jpg"
    Image.fromarray(cmyk, mode="CMYK").save(path, quality=95)
    with Image.open(path) as stored:
        assert stored.mode == "CMYK"
    decoded = _decoded(path).astype(int)
    for i, (c, m, y, k) in enumerate(colours):
        expected = np.array([(255 - v) * (255 - k) / 255 for v in (c, m, y)])
        patch = decoded[2:6, 8 * i + 2:8 * i + 6].reshape(-1, 3)
        assert np.abs(patch - expected).max() <= 8, (colours[i], patch[0], expected)
    assert np.abs(decoded[4, 4] - [255, 0, 0]).max() <= 8  # pure C-less, K-less red


def test_palette_transparency_composited_on_white(tmp_path: Path) -> None:
    palette = Image.new("P", (3, 1))
    palette.putpalette([255, 0, 0, 0, 0, 255, 0, 255, 0])
    palette.putdata([0, 1, 2])
    path = tmp_path / "pal.png"
    palette.save(path, transparency=bytes([0, 128, 255]))  # alpha per palette entry
    assert BACKGROUND == (255, 255, 255)
    # red fully transparent -> white; blue half transparent -> half-way to white; green opaque
    assert np.abs(_decoded(path).astype(int) - [[[255, 255, 255], [127, 127, 255],
                                                 [0, 255, 0]]]).max() <= 1
    palette.save(path, transparency=1)  # one transparent index: blue -> white
    assert _decoded(path).tolist() == [[[255, 0, 0], [255, 255, 255], [0, 255, 0]]]


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_alpha_composited_on_white(tmp_path: Path, mode: str) -> None:
    pixels = _pixels(6, 5, len(mode), seed=11)
    pixels[0, 0, -1], pixels[0, 1, -1] = 0, 255  # one transparent, one opaque pixel
    path = tmp_path / f"{mode}.png"
    Image.fromarray(pixels, mode=mode).save(path)
    alpha = pixels[..., -1:].astype(float) / 255
    colour = pixels[..., :-1].astype(float)
    expected = alpha * colour + (1 - alpha) * 255  # "over" a white background
    got = _decoded(path, len(mode) - 1).astype(float).reshape(expected.shape)
    assert np.abs(got - expected).max() <= 1
    assert (got[0, 0] == 255).all() and np.array_equal(got[0, 1], colour[0, 1])


def test_gray_to_rgb_and_rgb_to_gray(tmp_path: Path) -> None:
    gray = _pixels(5, 6, 1, seed=2)
    Image.fromarray(gray, mode="L").save(tmp_path / "gray.png")
    as_rgb = _decoded(tmp_path / "gray.png", 3)
    assert all(np.array_equal(as_rgb[..., c], gray) for c in range(3))
    rgb = _pixels(5, 6, 3, seed=4)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    luma = rgb.astype(float) @ np.array([0.299, 0.587, 0.114])  # ITU-R 601-2
    assert np.abs(_decoded(tmp_path / "rgb.png", 1) - luma).max() <= 1


@pytest.mark.parametrize(("orientation", "turns"), [(3, 2), (6, -1), (8, 1)])
def test_exif_orientation_applied(tmp_path: Path, orientation: int, turns: int) -> None:
    """EXIF orientation 6 means "rotate 90 degrees clockwise to display" (np.rot90 k=-1)."""
    pixels = _pixels(2, 3, seed=orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "photo.png"
    Image.fromarray(pixels).save(path, exif=exif)
    assert np.array_equal(_decoded(path), np.rot90(pixels, k=turns))


def test_exif_rotated_jpeg_photo(tmp_path: Path) -> None:
    """A 16x32 (HxW) JPEG, left half red and right half blue, tagged orientation 6, comes out
    32x16 with red on top."""
    pixels = np.zeros((16, 32, 3), dtype=np.uint8)
    pixels[:, :16] = (255, 0, 0)
    pixels[:, 16:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "phone.jpg"
    Image.fromarray(pixels).save(path, exif=exif, quality=95)
    upright = _decoded(path).astype(int)
    assert upright.shape == (32, 16, 3)
    assert np.abs(upright[4:12, 4:12] - [255, 0, 0]).max() <= 8
    assert np.abs(upright[20:28, 4:12] - [0, 0, 255]).max() <= 8


def test_first_frame_of_animation(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (4, 4), colour) for colour in ((255, 0, 0), (0, 255, 0))]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    assert (_decoded(tmp_path / "anim.gif") == [255, 0, 0]).all()


# -- the readers that use it ------------------------------------------------------------------

def test_explain_reads_files_through_the_decoder(tmp_path: Path) -> None:
    path = tmp_path / "g16.png"
    Image.fromarray(np.full((8, 8), 65535, dtype=np.uint16)).save(path)
    preprocess = Preprocess(img_size=(8, 8))
    batch, names = images_from_files([path], preprocess)
    assert names == [str(path)] and (batch == 255).all()  # scaled, as the decoder does
    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    with pytest.raises(InputError) as caught:
        images_from_files([path, bad], preprocess)
    says(str(caught.value), "notes.png", "not an image")


def test_predict_reads_files_through_the_decoder(tmp_path: Path) -> None:
    """An RGBA file predicts exactly as its white-composited RGB copy, and not as the same
    pixels with the alpha dropped or composited on black; an empty file gets the decoder's
    reason and fix."""
    from vitkit import create_model
    from vitkit.predict import predict

    torch.manual_seed(0)
    model = create_model("Ti/16", img_size=16, depth=1, num_classes=3)
    with torch.no_grad():  # random weights (the default init zeroes the head: all logits 0)
        for name, param in model.named_parameters():
            is_scale = "norm" in name and name.endswith("weight")
            param.normal_(1.0 if is_scale else 0.0, 0.1)
    rgba = _pixels(16, 16, 4, seed=5)
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "a.png")
    alpha = rgba[..., 3:].astype(float) / 255
    on_white = np.round(alpha * rgba[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    Image.fromarray(on_white).save(tmp_path / "b.png")
    (tmp_path / "c.png").write_bytes(b"")
    Image.fromarray(rgba[..., :3]).save(tmp_path / "d.png")  # other decodings of a.png
    Image.fromarray(np.round(alpha * rgba[..., :3]).astype(np.uint8)).save(tmp_path / "e.png")
    results = predict(model, [tmp_path], topk=3)
    assert [Path(r.path).name for r in results] == ["a.png", "b.png", "c.png", "d.png", "e.png"]
    assert results[0].indices == results[1].indices
    assert np.allclose(results[0].probs, results[1].probs, atol=0.02)
    for other in results[3:]:  # the comparison can fail: another decoding predicts otherwise
        assert (other.indices != results[0].indices
                or not np.allclose(other.probs, results[0].probs, atol=0.02))
    says(results[2].error, "empty file", "0 bytes", "copy or download it again")


# -- bounded fuzz -----------------------------------------------------------------------------

def test_fuzzed_image_files_load_or_are_refused_clearly(fuzzer: ModuleType) -> None:
    """Mutated PNG/JPEG/GIF/BMP/TIFF/WebP/PPM files (seeded; 300 cases, by count, not by the
    clock): every one decodes to a valid image or is refused with a known kind; no exception or
    warning escapes."""
    counts = fuzzer.fuzz_images(300, seed=1)
    assert counts.other == 0, counts.examples
    assert counts.cases == 300 and counts.clear_error > 0 and counts.loaded > 0
    assert set(FIXES) >= {"truncated", "corrupt", "not an image"}


def test_bytes_and_file_objects_decode_like_the_path(tmp_path: Path) -> None:
    """An image stored inside a dataset (bytes) decodes exactly as the same file on disk."""
    path = tmp_path / "a.png"
    path.write_bytes(_png_bytes(Image.fromarray(_pixels(9, 7), mode="RGB")))
    data = path.read_bytes()
    expected = _decoded(path)
    for source in (data, bytearray(data), io.BytesIO(data)):
        decoded = decode_image(source, 3)
        assert decoded.ok, decoded.reason
        np.testing.assert_array_equal(np.asarray(decoded.image), expected)


def test_bad_bytes_refused_like_bad_files(tmp_path: Path) -> None:
    data = _png_bytes(Image.fromarray(_pixels(32, 32), mode="RGB"))
    cut = data[: len(data) // 2]
    (tmp_path / "cut.png").write_bytes(cut)
    assert decode_image(b"").kind == "empty file"
    assert decode_image(b"hello, not an image").kind == "not an image"
    from_bytes, from_file = decode_image(cut), decode_image(tmp_path / "cut.png")
    assert from_bytes.kind == from_file.kind == "truncated"
    assert from_bytes.detail == from_file.detail
