"""`vitkit serve`'s JSON API through FastAPI's TestClient: predictions equal `vitkit predict`'s
on the same files (a classifier on images, a regression model on arrays), explain's maps, the
bearer token, and a 4xx JSON error naming the problem for each kind of bad upload, after which
the server still answers."""

from __future__ import annotations

import asyncio
import io
import math
import zipfile

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve_models import (
    CLASSES,
    TARGETS,
    fields,
    npy_bytes,
    png_bytes,
)
from vitkit.predict import predict_files
from vitkit.serve.app import create_app
from vitkit.serve.service import ModelService

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def client(classifier):
    app = create_app(ModelService.load(classifier), max_upload_mb=1.0)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def array_client(regressor):
    with TestClient(create_app(ModelService.load(regressor))) as test_client:
        yield test_client


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _post(client, route, files, **data):
    return client.post(route, files=[("file", item) for item in files], data=data)


def _still_serves(client, inputs="images"):
    sent = ("ok.png", png_bytes(7)) if inputs == "images" else ("ok.npy", npy_bytes(fields(1)[0]))
    response = _post(client, "/api/predict", [sent])
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 1


def test_predictions_equal_vitkit_predict_on_the_same_files(client, classifier, tmp_path):
    images = [png_bytes(seed, size) for seed, size in ((0, (20, 24)), (1, (16, 16)),
                                                       (2, (40, 9)))]
    paths = []
    for index, data in enumerate(images):
        paths.append(tmp_path / f"image{index}.png")
        paths[-1].write_bytes(data)
    expected = [row.to_dict() for row in predict_files(classifier, paths, topk=3).results]
    sent = [(path.name, data) for path, data in zip(paths, images, strict=True)]
    response = _post(client, "/api/predict", sent, topk="3")
    assert response.status_code == 200, response.text
    got = response.json()["predictions"]
    assert [row["path"] for row in got] == [p.name for p in paths]
    for row, want in zip(got, expected, strict=True):
        assert [t["index"] for t in row["topk"]] == [t["index"] for t in want["topk"]]
        assert [t["label"] for t in row["topk"]] == [t["label"] for t in want["topk"]]
        assert {t["label"] for t in row["topk"]} <= set(CLASSES)
        np.testing.assert_allclose([t["prob"] for t in row["topk"]],
                                   [t["prob"] for t in want["topk"]], atol=1e-5)


def test_regression_values_on_arrays_equal_vitkit_predict(array_client, regressor, tmp_path):
    batch, single = fields(3), fields(1, seed=5)[0]
    np.save(tmp_path / "batch.npy", batch)
    np.save(tmp_path / "single.npy", single)
    expected = [row.to_dict() for row in
                predict_files(regressor, [tmp_path / "batch.npy", tmp_path / "single.npy"])
                .results]
    response = _post(array_client, "/api/predict",
                     [("batch.npy", npy_bytes(batch)), ("single.npy", npy_bytes(single))])
    assert response.status_code == 200, response.text
    got = response.json()["predictions"]
    assert [row["path"] for row in got] == ["batch.npy[0]", "batch.npy[1]", "batch.npy[2]",
                                            "single.npy[0]"]
    np.testing.assert_allclose([row["values"] for row in got],
                               [row["values"] for row in expected], rtol=1e-5, atol=1e-5)
    assert all(row["names"] == TARGETS for row in got)


def test_model_describes_the_served_model(client):
    info = client.get("/api/model").json()
    assert info["task"] == "classification" and info["inputs"] == "images"
    assert info["grid"] == [4, 4] and info["depth"] == 2 and info["num_heads"] == 2
    assert info["names"] == CLASSES and info["precision"] == "fp32" and info["tta"] == "none"
    assert info["preprocess"]["img_size"] == [16, 16] and info["config"]["width"] == 32
    assert info["figures"] == ["attention_distance", "position_similarity", "filters"]
    assert client.get("/healthz").json() == {"status": "ok"}


def _explain(client, data=None, **fields_):
    response = _post(client, "/api/explain", [("x.png", data or png_bytes(3))], **fields_)
    assert response.status_code == 200, response.text
    return response.json()


def test_explain_map_is_the_grid_scaled_to_0_1_and_layer_and_head_change_it(client):
    assert _explain(client)["discard_ratio"] == 0.0  # the default, as `vitkit explain`
    rollout = _explain(client, discard_ratio="0")
    heat = np.array(rollout["map"])
    assert heat.shape == (4, 4) and rollout["grid"] == [4, 4]
    assert heat.min() == 0.0 and heat.max() == 1.0
    assert (rollout["layer"], rollout["head"], rollout["fusion"]) == (2, "all", "mean")
    assert rollout["overlay_png"].startswith("data:image/png;base64,")
    assert rollout["prediction"]["path"] == "x.png" and len(rollout["prediction"]["topk"]) == 3
    first = np.array(_explain(client, layer="1", discard_ratio="0")["map"])
    head0 = np.array(_explain(client, layer="2", head="0")["map"])
    head1 = np.array(_explain(client, layer="2", head="1")["map"])
    assert not np.allclose(first, heat) and not np.allclose(head0, head1)
    assert not np.allclose(_explain(client, discard_ratio="0", fusion="max")["map"], heat)
    assert not np.allclose(_explain(client, discard_ratio="0.5")["map"], heat)


def test_explain_on_an_array_model(array_client):
    response = _post(array_client, "/api/explain", [("f.npy", npy_bytes(fields(1)[0]))])
    assert response.status_code == 200, response.text
    assert np.array(response.json()["map"]).shape == (4, 4)
    assert response.json()["prediction"]["names"] == TARGETS


@pytest.mark.parametrize(("fields_", "parts"), [
    ({"layer": "3"}, ("layer", "1..2", "got 3")), ({"head": "2"}, ("head", "0..1", "got 2")),
    ({"head": "first"}, ("head", "'all'", "'first'")),
    ({"discard_ratio": "1"}, ("discard_ratio", "[0, 1)", "got 1")),
    ({"fusion": "median"}, ("fusion", "'median'", "mean", "max", "min")),
    ({"layer": "two"}, ("layer='two'", "layer number"))])
def test_explain_refuses_bad_values(client, fields_, parts):
    """A bad explain setting is a 400 naming the field, the value and the values it takes."""
    response = _post(client, "/api/explain", [("x.png", png_bytes(3))], **fields_)
    assert response.status_code == 400
    says(response.json()["error"], *parts)


def _bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, "PNG")  # 100 M pixels, ~13 kB
    return buffer.getvalue()


def _pickled() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buffer.getvalue()


# (name, files, status, what the error names: the file, the problem, the fix)
BAD_IMAGES = [
    ("not an image", [("notes.png", b"just some text, not pixels")], 415,
     ("notes.png", "not an image", "image files")),
    ("empty", [("empty.png", b"")], 400, ("empty.png", "empty file", "again")),
    ("truncated", [("cut.png", png_bytes(1)[:80])], 400, ("cut.png", "truncated", "again")),
    ("bomb", [("bomb.png", _bomb())], 413, ("bomb.png", "decompression-bomb limit", "shrink")),
    ("array to an image model", [("x.npy", npy_bytes(np.zeros((3, 16, 16), np.uint8)))], 415,
     ("x.npy", "trained on pictures", "send an image")),
    ("too big", [("big.png", b"\x89PNG" + bytes(2 * 2**20))], 413,
     ("over the server's limit", "1 MB", "--max-upload-mb")),
]


@pytest.mark.parametrize(("files", "status", "parts"), [case[1:] for case in BAD_IMAGES],
                         ids=[case[0] for case in BAD_IMAGES])
def test_bad_image_uploads_get_their_4xx_and_the_server_keeps_serving(client, files, status,
                                                                      parts):
    response = _post(client, "/api/predict", files)
    assert response.status_code == status, response.text
    says(response.json()["error"], *parts)
    _still_serves(client)


def _npz_bytes(images: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, images=images)
    return buffer.getvalue()


def _npy_promising(shape: tuple[int, ...]) -> bytes:
    """An .npy whose header promises `shape` float32 values, followed by 64 bytes."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue() + bytes(64)


def _npz_holding(npy: bytes, member: str = "images.npy") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, npy)
    return buffer.getvalue()


# (name, files, status, what the error names: the file, the problem, the fix)
BAD_ARRAYS = [
    ("image to an array model", [("x.png", png_bytes(1))], 415,
     ("x.png", "trained on arrays", "numpy.save")),
    ("wrong channels", [("x.npy", npy_bytes(np.zeros((2, 3, 16, 16), np.float32)))], 422,
     ("x.npy", "(2, 3, 16, 16)", "channel", "(N, 1, H, W)")),
    ("wrong rank", [("x.npy", npy_bytes(np.zeros((1, 1, 1, 16, 16), np.float32)))], 422,
     ("x.npy", "5 dimensions", "(N, C, H, W)")),
    ("strings", [("x.npy", npy_bytes(np.array([["a"] * 16] * 16)))], 422,
     ("x.npy", "numbers", "dtype")),
    ("nan", [("x.npy", npy_bytes(np.full((16, 16), np.nan, np.float32)))], 422,
     ("x.npy", "NaN", "nan_to_num")),
    ("pickle", [("x.npy", _pickled())], 400, ("x.npy", "no pickled objects", "numpy.save")),
    ("damaged", [("x.npy", npy_bytes(fields(2))[:100])], 400,
     ("x.npy", "cannot read", "numpy.save")),
    # a header promising 95 GiB, which numpy would allocate before reading: a 400, not a 500
    ("header promises more", [("x.npy", _npy_promising((10**8, 16, 16)))], 400,
     ("x.npy", "is damaged", "numpy.save")),
    ("npz header promises more", [("x.npz", _npz_holding(_npy_promising((10**8, 16, 16))))],
     400, ("x.npz", "is damaged", "numpy.save")),
    # numpy's NpzFile reads a member named "images" before "images.npy"
    ("npz member 'images' promises more",
     [("x.npz", _npz_holding(_npy_promising((10**8, 16, 16)), "images"))], 400,
     ("x.npz", "is damaged", "numpy.save")),
    # 0.03 MB compressed, 31 MB of images: over the 20 MB body limit once expanded
    ("npz expanding", [("x.npz", _npz_bytes(np.zeros((30000, 16, 16), np.float32)))], 413,
     ("x.npz", "over the limit", "fewer images per file", "--max-upload-mb")),
]


@pytest.mark.parametrize(("files", "status", "parts"), [case[1:] for case in BAD_ARRAYS],
                         ids=[case[0] for case in BAD_ARRAYS])
def test_bad_array_uploads_get_their_4xx_and_the_server_keeps_serving(array_client, files,
                                                                      status, parts):
    response = _post(array_client, "/api/predict", files)
    assert response.status_code == status, response.text
    says(response.json()["error"], *parts)
    _still_serves(array_client, "arrays")


def test_array_files_share_the_body_limit_and_the_advice_works(regressor):
    with TestClient(create_app(ModelService.load(regressor), max_upload_mb=1.0)) as client:
        ramp = np.linspace(0.0, 1.0, 16 * 16, dtype=np.float32).reshape(16, 16)
        big = _npz_bytes(np.stack([ramp + k / 300 for k in range(300)]))  # 0.3 MB of images
        assert len(big) < 0.1 * 2**20  # compressed: four are well within the body's limit
        refused = _post(client, "/api/predict", [("a.npz", big), ("b.npz", big),
                                                 ("c.npz", big), ("d.npz", big)])
        assert refused.status_code == 413, refused.text
        says(refused.json()["error"], "over the limit", "send fewer images per file",
             "--max-upload-mb")
        followed = _post(client, "/api/predict", [("a.npz", big), ("b.npz", big)])
        assert followed.status_code == 200 and len(followed.json()["predictions"]) == 600


def test_a_multipart_type_without_boundary_is_a_400_naming_it(client):
    response = client.post("/api/predict", content=b"--x\r\n",
                           headers={"Content-Type": "multipart/form-data"})
    assert response.status_code == 400
    says(response.json()["error"], "no boundary", "Content-Type", "curl -F file=@PATH")


def test_a_client_gone_mid_body_is_a_400_not_a_bug():
    from starlette.requests import ClientDisconnect

    from vitkit.serve.uploads import UploadError, read_form

    class Gone:
        def __init__(self) -> None:
            self.headers = {"content-type": "multipart/form-data; boundary=x"}

        async def stream(self):
            yield b"--x\r\n"
            raise ClientDisconnect()

    with pytest.raises(UploadError, match="disconnected") as refused:
        asyncio.run(read_form(Gone(), 2**20))
    assert refused.value.status == 400


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_limits_must_be_finite(classifier, value):
    from vitkit.errors import ConfigError
    from vitkit.serve.batching import DynamicBatcher

    with pytest.raises(ConfigError) as info:
        create_app(ModelService.load(classifier), max_upload_mb=value)
    says(str(info.value), "max_upload_mb", "finite")
    with pytest.raises(ConfigError) as info:
        DynamicBatcher(lambda inputs: inputs, max_wait_ms=value)
    says(str(info.value), "max_wait_ms", "finite")


@pytest.mark.parametrize("flag", ["--max-wait-ms", "--max-upload-mb"])
def test_serve_refuses_infinite_limits_at_once(classifier, flag, capsys):
    from vitkit.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", str(classifier), flag, "inf"])
    assert exited.value.code == 2
    says(capsys.readouterr().err, flag, "finite", "inf")


def test_healthz_answers_head_too(client):
    assert client.head("/healthz").status_code == 200


def test_bad_requests_are_json_errors(client):
    assert client.post("/api/predict", data={"topk": "3"}).status_code == 415  # no multipart
    no_file = client.post("/api/predict", files={"other": ("a.txt", b"x", "text/plain")})
    assert no_file.status_code == 400
    says(no_file.json()["error"], "'file' fields", "'other'", "curl -F file=@PATH")
    topk = _post(client, "/api/predict", [("a.png", png_bytes())], topk="0")
    assert topk.status_code == 400
    says(topk.json()["error"], "topk", ">= 1", "got 0")
    assert _post(client, "/api/predict", [("a.png", png_bytes())], topk="1").status_code == 200
    missing = client.get("/api/nothing")
    assert missing.status_code == 404
    says(missing.json()["error"], "/api/nothing", "POST /api/predict")
    two = _post(client, "/api/explain", [("a.png", png_bytes()), ("b.png", png_bytes(1))])
    assert two.status_code == 400
    says(two.json()["error"], "2 files", "takes 1")
    assert client.get("/api/figures/nothing.png").status_code == 404
    _still_serves(client)


def test_the_token_guards_the_api_but_not_healthz(classifier):
    app = create_app(ModelService.load(classifier), token=TOKEN)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = client.get("/api/model", headers=headers)
            assert refused.status_code == 401
            says(refused.json()["error"], "token", "Authorization: Bearer", "--token")
        assert client.post("/api/predict", files=[("file", ("a.png", png_bytes()))]
                           ).status_code == 401
        assert client.get("/api/model", headers={"Authorization": f"Bearer {TOKEN}"}
                          ).status_code == 200
        assert client.get(f"/api/model?token={TOKEN}").status_code == 200
        ok = client.post("/api/predict", files=[("file", ("a.png", png_bytes()))],
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.json()["predictions"][0]["path"] == "a.png"


def test_the_page_or_its_note(client):
    response = client.get("/")
    assert response.status_code == 200 and "<title>" in response.text.lower()


def test_flip_tta_serves_what_vitkit_predict_gives(classifier, tmp_path):
    """--tta flip (or weights whose run evaluated with it) serves the mirror-averaged
    outputs, as `vitkit predict --tta flip` gives them; --tta none the plain ones."""
    from vitkit import load_pretrained, save_pretrained

    model = load_pretrained(classifier)
    model.eval_tta = "flip"
    flip_folder = save_pretrained(model, tmp_path / "flip")
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(4, (20, 24)))
    served = {}
    for folder, tta, expected_tta in ((flip_folder, None, "flip"), (classifier, "flip", "flip"),
                                      (flip_folder, "none", "none")):
        service = ModelService.load(folder, tta=tta)
        assert service.describe()["tta"] == expected_tta
        with TestClient(create_app(service)) as test_client:
            got = _post(test_client, "/api/predict", [(path.name, path.read_bytes())],
                        topk="3").json()["predictions"][0]
        want = predict_files(folder, [path], topk=3, tta=expected_tta).results[0].to_dict()
        probs = [t["prob"] for t in got["topk"]]
        np.testing.assert_allclose(probs, [t["prob"] for t in want["topk"]], rtol=1e-4,
                                   atol=1e-9)
        served[expected_tta] = probs
    assert not np.allclose(served["flip"], served["none"], rtol=1e-2, atol=0)  # the mirror counts
