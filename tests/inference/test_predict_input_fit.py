"""Inputs that do not fit the model are refused by name, never guessed: an image file (8-bit,
0-255) for a model trained on arrays in its data's units, and an array that is one image of
other channels for a one-channel model (rather than split into images of its rows or
colour planes), or 16-bit arrays for a model of 8-bit pictures. Each refusal's advice,
followed, works."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit import create_model, save_pretrained
from vitkit.cli import main
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
        "img_size": [16, 16], "init": "trunc_normal"}


def regression_model() -> torch.nn.Module:
    """A one-channel model trained on arrays (data=arrays: scale 1, the data's units)."""
    torch.manual_seed(0)
    model = create_model({**TINY, "in_chans": 1, "num_classes": 1})
    model.task = TaskSpec("regression", names=["value"], target_mean=[0.0], target_std=[1.0])
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0, mean=(0.5,), std=(0.25,))
    return model.eval()


def picture_model() -> torch.nn.Module:
    """A classifier trained on 8-bit grey pictures (scale 255)."""
    torch.manual_seed(0)
    model = create_model({**TINY, "in_chans": 1, "num_classes": 3})
    model.preprocess = Preprocess(img_size=(16, 16), mean=(0.5,), std=(0.5,))
    return model.eval()


def fields(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape).astype(np.float32)


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def predict_cli(capsys, *args: object) -> tuple[int, str, str]:
    code = main(["predict", *map(str, args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture
def reg(tmp_path):
    return save_pretrained(regression_model(), tmp_path / "reg")


# -- an image file for a model trained on arrays ------------------------------------------------


def test_a_png_given_to_a_model_trained_on_arrays_is_refused_and_an_npy_as_advised_works(
        tmp_path, capsys, reg):
    field = fields((16, 16))
    png = tmp_path / "field.png"
    Image.fromarray((field * 255).round().astype(np.uint8)).save(png)
    code, out, err = predict_cli(capsys, reg, png)
    assert code == 2
    says(out, str(png), "image file", "8-bit", "trained on arrays", "units", ".npy", ".npz")
    says(err, str(png), "image file", "trained on arrays")  # the row, named
    assert (out + err).count("trained on arrays in its data's own units") == 1  # said once
    assert "valid image files" not in err  # not "cannot read it as an image": it can
    # the advice: the values in the data's units, saved with numpy.save
    np.save(tmp_path / "field.npy", field)
    code, out, err = predict_cli(capsys, reg, tmp_path / "field.npy")
    assert code == 0 and out.startswith(f"{tmp_path / 'field.npy'}[0]: value=")


def test_a_png_beside_arrays_is_refused_by_name_and_the_arrays_are_predicted(
        tmp_path, capsys, reg):
    np.save(tmp_path / "a.npy", fields((16, 16)))
    png = tmp_path / "a.png"
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(png)
    code, out, err = predict_cli(capsys, reg, tmp_path / "a.npy", png)
    assert code == 1
    assert f"{tmp_path / 'a.npy'}[0]: value=" in out
    row = next(line for line in out.splitlines() if line.startswith(f"{png}: error: "))
    says(row, "image file", "arrays")
    says(err, "could not be read", str(png))


def test_the_refusal_of_pictures_is_printed_once_for_many_and_the_advice_works(
        tmp_path, capsys, reg):
    """Several pictures for a model trained on arrays: the refusal and its fix once (on the
    first picture's row), each other picture named as refused, the last line naming that row;
    the arrays the advice asks for are then predicted."""
    field = fields((16, 16))
    pngs = [tmp_path / f"f{i}.png" for i in range(3)]
    for png in pngs:
        Image.fromarray((field * 255).round().astype(np.uint8)).save(png)
    code, out, err = predict_cli(capsys, reg, *pngs)
    assert code == 2
    assert (out + err).count("trained on arrays in its data's own units") == 1
    assert (out + err).count("numpy.save(PATH, array)") == 1
    for png in pngs:
        says(next(line for line in out.splitlines() if line.startswith(f"{png}: error: ")),
             "image file", "arrays")
    says(err, "none of the 3", str(pngs[0]))
    np.save(tmp_path / "f.npy", field)  # the advice: the values in the data's units
    code, out, err = predict_cli(capsys, reg, tmp_path / "f.npy")
    assert code == 0 and f"{tmp_path / 'f.npy'}[0]: value=" in out


def test_image_file_refusal_is_for_array_models_only_and_pictures_still_work(tmp_path, capsys):
    from vitkit.data.array_inputs import image_file_refusal
    from vitkit.predict import predict

    png = tmp_path / "grey.png"
    Image.fromarray(np.full((16, 16), 200, np.uint8)).save(png)
    assert image_file_refusal(png, 255.0) is None
    assert "trained on arrays" in image_file_refusal(png, 1.0)
    says(image_file_refusal(png, 65535.0), "65535", "255")  # as serve refuses
    # a picture model takes the picture, and a uint8 array of it, the same way
    model = picture_model()
    np.save(tmp_path / "grey.npy", np.full((16, 16), 200, np.uint8))
    inputs: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda module, args: inputs.append(args[0].clone()))
    from_png, from_npy = predict(model, [png, tmp_path / "grey.npy"], topk=3)
    assert from_png.ok and from_npy.ok
    batch = torch.cat(inputs)
    assert torch.equal(batch[0], batch[1])  # the same pixels in
    # the same class scores out (one batch: AVX-512 kernels may differ by 3e-8 between rows)
    assert np.allclose(from_png.probs, from_npy.probs, rtol=0, atol=1e-6)
    # an array model refuses it
    row, = predict(regression_model(), [png])
    assert not row.ok
    says(row.error, "image file", "give the model arrays")


# -- an array that is one image of other channels, for a one-channel model -------------------


def test_one_channels_last_rgb_array_is_refused_not_split_into_16_images(
        tmp_path, capsys, reg):
    rgb = fields((16, 16, 3))
    np.save(tmp_path / "rgb.npy", rgb)
    code, out, err = predict_cli(capsys, reg, tmp_path / "rgb.npy")
    assert code == 2
    assert "resizing" not in err and "[1]" not in out
    says(err, "(16, 16, 3)", "one image of 3 channels", "one-channel", "(1, 16, 16)",
         "(H, W)", "(N, 1, H, W)")
    # the advice: one channel of it, (H, W)
    np.save(tmp_path / "one.npy", rgb[..., 0])
    code, out, _ = predict_cli(capsys, reg, tmp_path / "one.npy")
    assert code == 0 and len(out.splitlines()) == 1
    # or its three planes as three one-channel images, (N, 1, H, W)
    np.save(tmp_path / "three.npy", np.moveaxis(rgb, -1, 0)[:, None])
    code, out, _ = predict_cli(capsys, reg, tmp_path / "three.npy")
    assert code == 0 and len(out.splitlines()) == 3


def test_n_hw_arrays_stay_n_images_and_n1hw_says_so_outright(tmp_path, capsys, reg):
    """(3, H, W) for a one-channel model is three images, as documented, also of another
    size (three digits, not one RGB image); (N, 1, H, W) says it outright."""
    from vitkit.predict import predict

    np.save(tmp_path / "three.npy", fields((3, 24, 20))[:, None])
    code, out, _ = predict_cli(capsys, reg, tmp_path / "three.npy")
    assert code == 0 and len(out.splitlines()) == 3
    # documented shapes keep working: (N, H, W) at the model's size, or of another size when
    # the first axis is no colour count; a 2-D image
    model = regression_model()
    np.save(tmp_path / "nhw.npy", fields((3, 16, 16)))
    np.save(tmp_path / "big.npy", fields((3, 24, 20)))
    np.save(tmp_path / "hw.npy", fields((16, 16)))
    rows = predict(model, [tmp_path / "nhw.npy", tmp_path / "big.npy", tmp_path / "hw.npy"])
    assert [row.path.rpartition("/")[2] for row in rows] == [
        "nhw.npy[0]", "nhw.npy[1]", "nhw.npy[2]", "big.npy[0]", "big.npy[1]", "big.npy[2]",
        "hw.npy[0]"]
    assert all(row.ok for row in rows)


def test_a_channels_last_one_channel_image_is_one_image(tmp_path):
    from vitkit.predict import predict

    model = regression_model()
    field = fields((16, 16))
    np.save(tmp_path / "hw1.npy", field[..., None])
    np.save(tmp_path / "hw.npy", field)
    hw1 = predict(model, [tmp_path / "hw1.npy"])
    hw, = predict(model, [tmp_path / "hw.npy"])
    assert len(hw1) == 1 and hw1[0].report == hw.report


def test_serve_and_explain_refuse_a_channels_last_rgb_array_for_a_one_channel_model(tmp_path):
    from vitkit.analysis.inputs import images_from_files
    from vitkit.errors import InputError
    from vitkit.serve.uploads import Upload, UploadError, decode_upload

    model = regression_model()
    buffer = io.BytesIO()
    np.save(buffer, fields((16, 16, 3)))
    upload = Upload("file", "rgb.npy", "application/octet-stream", buffer.getvalue())
    with pytest.raises(UploadError) as refused:
        decode_upload(upload, model.preprocess, "arrays")
    assert refused.value.status == 422
    says(str(refused.value), "(16, 16, 3)", "one image", "3 channels")
    np.save(tmp_path / "rgb.npy", fields((16, 16, 3)))
    with pytest.raises(InputError) as info:
        images_from_files([tmp_path / "rgb.npy"], model.preprocess)
    says(str(info.value), "(16, 16, 3)", "one image", "3 channels")
    # (N, H, W) of the model's size still reads as N images there
    np.save(tmp_path / "nhw.npy", fields((3, 16, 16)))
    images, names = images_from_files([tmp_path / "nhw.npy"], model.preprocess)
    assert images.shape == (3, 1, 16, 16) and len(names) == 3


def test_explain_refuses_a_picture_for_a_model_trained_on_arrays_and_takes_the_array(tmp_path):
    from vitkit.analysis.inputs import images_from_files
    from vitkit.errors import InputError

    model, field = regression_model(), fields((16, 16))
    png = tmp_path / "field.png"
    Image.fromarray((field * 255).round().astype(np.uint8)).save(png)
    with pytest.raises(InputError) as info:
        images_from_files([png], model.preprocess)
    says(str(info.value), str(png), "image file", "8-bit", "trained on arrays", ".npy")
    np.save(tmp_path / "field.npy", field)  # the advice: the array, in its units
    images = images_from_files([tmp_path / "field.npy"], model.preprocess)[0]
    assert images.shape == (1, 1, 16, 16) and torch.equal(images[0, 0], torch.from_numpy(field))
    # and a channels-last (24, 20, 3) of another size is refused there too
    np.save(tmp_path / "rgb.npy", fields((24, 20, 3)))
    with pytest.raises(InputError) as info:
        images_from_files([tmp_path / "rgb.npy"], model.preprocess)
    says(str(info.value), "(24, 20, 3)", "3 channels", "(H, W, C)")


def test_a_folder_of_arrays_alone_says_to_name_them_and_naming_them_works(tmp_path, capsys, reg):
    folder = tmp_path / "fields"
    folder.mkdir()
    for i in range(2):
        np.save(folder / f"f{i}.npy", fields((16, 16), seed=i))
    code, _, err = predict_cli(capsys, reg, folder)
    assert code == 2
    says(err, str(folder), "2 array file(s)", "not searched", "one by one", f"{folder}/*.npy")
    code, out, _ = predict_cli(capsys, reg, *sorted(folder.glob("*.npy")))  # the glob
    assert code == 0 and len(out.splitlines()) == 2


def test_16_bit_arrays_for_a_picture_model_get_the_conversion_that_works(tmp_path, capsys):
    weights = vitkit.save_pretrained(vitkit.create_model(
        {"img_size": 16, "patch_size": 8, "in_chans": 1, "width": 16, "depth": 1,
         "num_heads": 2, "mlp_dim": 32, "num_classes": 3}), tmp_path / "w")
    a = np.random.default_rng(0).integers(0, 65535, (2, 1, 16, 16), dtype=np.uint16)
    np.save(tmp_path / "wide.npy", a)
    assert main(["predict", str(weights), str(tmp_path / "wide.npy")]) != 0
    says(capsys.readouterr().err, "16-bit", "(a >> 8).astype(numpy.uint8)")
    np.save(tmp_path / "bytes.npy", (a >> 8).astype(np.uint8))  # the advice followed
    assert main(["predict", str(weights), str(tmp_path / "bytes.npy")]) == 0
