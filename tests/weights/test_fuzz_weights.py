"""Every weights reader turns malformed input into a clear `CheckpointError`, never a raw one.

Bounded runs of tools/fuzz_weights.py per reader (only a `VitkitError` naming the file, or a
load, is acceptable), then the targeted cases with their exact messages: a missing tensor
names itself and the layout, a wrong shape the expected and found shapes, damaged bytes say
"damaged", big-endian arrays load equal, NaN/inf are refused by name, checksums catch changed
tensors, and `vitkit export` of an incomplete .npz ends in a message, not a traceback.
"""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vitkit.catalog import load_pretrained, read_weights
from vitkit.cli import main
from vitkit.errors import CheckpointError, VitkitError
from vitkit.train.checkpoint import read_checkpoint
from vitkit.weights import save_npz, save_pretrained
from vitkit.weights.checksum import tensors_checksum

ORIGINAL_QUERY = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"


def _model(weights_fuzzer: ModuleType, hybrid: bool = False) -> torch.nn.Module:
    return weights_fuzzer.tiny_model(hybrid)


def _arrays(weights_fuzzer: ModuleType, layout: str = "original") -> dict[str, np.ndarray]:
    return weights_fuzzer.to_official_arrays(_model(weights_fuzzer), layout)


def _same_weights(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    ours, theirs = model.state_dict(), reference.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _same_outputs(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    """Equal logits (big_vision layouts fold the class token's position into the token)."""
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return torch.allclose(model(images), reference.eval()(images), atol=1e-5)


# -- bounded fuzz, per reader ---------------------------------------------------------------------
@pytest.mark.parametrize("reader", ["npz", "npz_big_vision", "npz_hybrid", "timm_pth",
                                    "timm_safetensors", "hf_folder", "vitkit_folder",
                                    "train_checkpoint"])
def test_fuzzed_weights_load_or_are_refused_clearly(weights_fuzzer: ModuleType,
                                                     reader: str) -> None:
    """Seeded structural and byte mutations: every input loads or raises a VitkitError that
    names the file; both outcomes occur, so the mutations reach past the first check."""
    if reader == "hf_folder":
        pytest.importorskip("transformers")  # writes the seed folder
    counts = weights_fuzzer.fuzz_reader(reader, 400, seed=11)  # by count, not by the clock
    assert counts.other == 0, counts.examples
    assert counts.cases == 400
    assert counts.clear_error > 0 and counts.loaded > 0, counts.line()


def test_fuzz_cases_are_seeded(weights_fuzzer: ModuleType, tmp_path: Path) -> None:
    """The same seed writes the same mutated bytes (a failure can be replayed)."""
    base = weights_fuzzer.make_seed("npz")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    for folder in (first, second):
        rng = np.random.default_rng(5)
        for _ in range(5):
            path, _ = weights_fuzzer.write_case(base, rng, folder)
    assert (first / path.name).read_bytes() == (second / path.name).read_bytes()


# -- official .npz --------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, name, shown", [
    ("original", ORIGINAL_QUERY, ORIGINAL_QUERY),
    ("big_vision", "params/Transformer/encoderblock_0/MlpBlock_0/Dense_1/bias", None),
    ("scan", "params/Transformer/encoderblock/LayerNorm_1/scale",
     "params/Transformer/encoderblock/[0]/LayerNorm_1/scale"),  # layer 0 of the stack
    ("opt_target", "opt/target/embedding/bias", None),
])
def test_npz_missing_tensor_names_it_and_the_layout(weights_fuzzer, tmp_path, layout, name,
                                                    shown):
    arrays = _arrays(weights_fuzzer, layout)
    complete = dict(arrays)
    del arrays[name]
    path = tmp_path / "w.npz"
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError) as info:
        load_pretrained(path)
    message = str(info.value)
    assert str(path) in message and f"{shown or name!r} is missing" in message
    assert f"{layout!r} layout" in message and "download it again" in message
    np.savez(path, **complete)  # the advice: the complete file loads
    assert _same_outputs(load_pretrained(path), _model(weights_fuzzer))


def test_npz_wrong_shape_names_expected_and_found(weights_fuzzer, tmp_path):
    arrays = _arrays(weights_fuzzer)
    arrays[ORIGINAL_QUERY] = arrays[ORIGINAL_QUERY].reshape(16, 16)  # (16, 2, 8) flattened
    np.savez(tmp_path / "w.npz", **arrays)
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "w.npz")
    says(refused.value, "query/kernel", "(16, 16)", "(16, *, *)")
    arrays = _arrays(weights_fuzzer)
    arrays["Transformer/posembed_input/pos_embedding"] = np.zeros((1, 5, 12), np.float32)
    np.savez(tmp_path / "w.npz", **arrays)
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "w.npz")
    says(refused.value, "pos_embedding", "(1, 5, 12)", "(1, *, 16)")


def test_npz_big_endian_arrays_load_and_equal_the_original(weights_fuzzer, tmp_path):
    arrays = {k: v.astype(">f4") for k, v in _arrays(weights_fuzzer).items()}
    arrays["cls"] = arrays["cls"].astype(">f8")
    np.savez(tmp_path / "be.npz", **arrays)
    assert _same_weights(load_pretrained(tmp_path / "be.npz"), _model(weights_fuzzer))


def test_npz_fortran_order_and_float16_load(weights_fuzzer, tmp_path):
    arrays = _arrays(weights_fuzzer)
    arrays[ORIGINAL_QUERY] = np.asfortranarray(arrays[ORIGINAL_QUERY])
    np.savez(tmp_path / "f.npz", **arrays)
    assert _same_weights(load_pretrained(tmp_path / "f.npz"), _model(weights_fuzzer))


def test_nan_and_inf_are_refused_naming_the_tensors(weights_fuzzer, tmp_path):
    arrays = _arrays(weights_fuzzer)
    arrays["cls"] = arrays["cls"].copy()
    arrays["cls"][0, 0, 3] = np.nan
    arrays["head/bias"] = arrays["head/bias"].copy()
    arrays["head/bias"][1] = -np.inf
    np.savez(tmp_path / "nan.npz", **arrays)
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "nan.npz")
    says(refused.value, "2 tensors", "NaN or inf", "cls_token, head.bias")
    state = _model(weights_fuzzer).state_dict()
    state["blocks.0.mlp.fc1.weight"][0, 0] = float("inf")
    save_file(state, tmp_path / "inf.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "inf.safetensors", num_heads=2)
    says(refused.value, "1 tensor", "NaN or inf", "blocks.0.mlp.fc1.weight")


@pytest.mark.parametrize("bad", [np.zeros((1, 1, 16), "datetime64[s]"), np.zeros((1, 1, 16), "U3"),
                                 np.zeros((1, 1, 16), np.complex64)])
def test_npz_non_numeric_dtypes_are_refused_naming_the_tensor(weights_fuzzer, tmp_path, bad):
    arrays = _arrays(weights_fuzzer)
    arrays["cls"] = bad
    np.savez(tmp_path / "w.npz", **arrays)
    with pytest.raises(CheckpointError) as info:
        load_pretrained(tmp_path / "w.npz")
    assert f"array 'cls' has dtype {bad.dtype}, which is not a number type" in str(info.value)
    arrays["cls"] = bad.real.astype(np.float32) if bad.dtype.kind == "c" else \
        np.zeros((1, 1, 16), np.float32)  # re-saved as float32, as the message says
    np.savez(tmp_path / "w.npz", **arrays)
    assert load_pretrained(tmp_path / "w.npz").cls_token.shape == (1, 1, 16)


def test_pickled_objects_only_named_when_the_dtype_is_object(weights_fuzzer, tmp_path):
    arrays = _arrays(weights_fuzzer)
    arrays["cls"] = arrays["cls"].astype(object)
    np.savez(tmp_path / "obj.npz", **arrays)
    with pytest.raises(CheckpointError, match="'cls' holds pickled Python objects"):
        load_pretrained(tmp_path / "obj.npz")
    # a corrupt .npy header (valid zip, CRC ok) is damage, not pickles
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in _arrays(weights_fuzzer).items():
            member = io.BytesIO()
            np.save(member, array)
            data = member.getvalue()
            if name == "cls":
                data = data.replace(b"'descr'", b"'dexcr'")
            archive.writestr(name + ".npy", data)
    (tmp_path / "hdr.npz").write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError) as info:
        load_pretrained(tmp_path / "hdr.npz")
    assert "is damaged" in str(info.value) and "header of 'cls'" in str(info.value)
    assert "holds pickled" not in str(info.value)


def test_npz_header_claiming_terabytes_is_damaged_before_allocating(weights_fuzzer, tmp_path):
    rng = np.random.default_rng(0)
    data = (tmp_path / "ok.npz")
    np.savez(data, **_arrays(weights_fuzzer))
    for attempt in range(4):
        path = tmp_path / f"huge{attempt}.npz"
        path.write_bytes(weights_fuzzer.huge_npy_header(data.read_bytes(), rng))
        tracemalloc.start()
        with pytest.raises(CheckpointError, match=r"is damaged \(the header of .* claims shape"):
            load_pretrained(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 50 * 2**20  # nothing near the claimed size was allocated


def _member_data_offset(archive: bytes, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start (its local header's own name and extra lengths)."""
    name_len, extra_len = struct.unpack("<HH", archive[info.header_offset + 26:
                                                      info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len


def _stored_npz(weights_fuzzer: ModuleType, path: Path) -> bytes:
    np.savez(path, **_arrays(weights_fuzzer))
    return path.read_bytes()


def test_npz_flipped_truncated_or_unknown_compression_is_damaged(weights_fuzzer, tmp_path):
    good = _stored_npz(weights_fuzzer, tmp_path / "good.npz")
    info = zipfile.ZipFile(tmp_path / "good.npz").getinfo(ORIGINAL_QUERY + ".npy")
    data_at = _member_data_offset(good, info) + 200
    flipped = bytearray(good)
    flipped[data_at] ^= 0x10  # inside the kernel's float data: only the CRC can tell
    unknown = bytearray(good)
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        start = 0
        while (start := unknown.find(signature, start)) >= 0:
            unknown[start + offset:start + offset + 2] = struct.pack("<H", 99)
            start += 4
    cases = {"flipped": bytes(flipped), "truncated": good[:len(good) // 2],
             "unknown_compression": bytes(unknown)}
    for name, data in cases.items():
        path = tmp_path / f"{name}.npz"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as refused:
            load_pretrained(path)
        says(refused.value, str(path), "damaged", "download or copy it again")
    (tmp_path / "flipped.npz").write_bytes(good)  # the advice: a good copy loads
    assert _same_weights(load_pretrained(tmp_path / "flipped.npz"), _model(weights_fuzzer))


@pytest.mark.parametrize("layout", ["original", "big_vision"])
def test_export_of_npz_without_embedding_bias_says_so(weights_fuzzer, tmp_path, capsys,
                                                      layout):
    """`vitkit export` of an .npz without embedding/bias is a clean error naming the array."""
    prefix = "params/" if layout == "big_vision" else ""
    arrays = _arrays(weights_fuzzer, layout)
    del arrays[prefix + "embedding/bias"]
    np.savez(tmp_path / "w.npz", **arrays)
    assert main(["export", str(tmp_path / "w.npz"), "--out", str(tmp_path / "w.onnx")]) == 2
    err = capsys.readouterr().err
    assert f"'{prefix}embedding/bias' is missing" in err and "Traceback" not in err
    assert not (tmp_path / "w.onnx").exists()


def test_export_of_hybrid_npz_works_or_names_the_missing_tensor(weights_fuzzer, tmp_path,
                                                                 capsys):
    model = _model(weights_fuzzer, hybrid=True)
    save_npz(model, tmp_path / "h.npz", layout="big_vision")
    assert main(["export", str(tmp_path / "h.npz"), "--out", str(tmp_path / "h.onnx")]) == 0
    arrays = dict(np.load(tmp_path / "h.npz"))
    del arrays["params/block1/unit1/gn2/scale"]
    np.savez(tmp_path / "h2.npz", **arrays)
    assert main(["export", str(tmp_path / "h2.npz"), "--out", str(tmp_path / "h2.onnx")]) == 2
    assert "'params/block1/unit1/gn2/scale' is missing" in capsys.readouterr().err


# -- timm and Hugging Face ------------------------------------------------------------------------
def test_timm_missing_key_and_wrong_shape_are_named(weights_fuzzer, tmp_path):
    state = _model(weights_fuzzer).state_dict()
    dropped = {k: v for k, v in state.items() if k != "blocks.0.attn.proj.bias"}
    torch.save(dropped, tmp_path / "w.pth")
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "w.pth", num_heads=2)
    says(refused.value, "missing", "blocks.0.attn.proj.bias")
    state["blocks.0.mlp.fc2.weight"] = state["blocks.0.mlp.fc2.weight"][:, :-1]
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "w.safetensors", num_heads=2)
    says(refused.value, "blocks.0.mlp.fc2.weight", "(16, 31)", "(16, 32)")


def test_pth_with_a_flipped_tensor_byte_is_damaged(weights_fuzzer, tmp_path):
    """torch.load does not check zip CRCs; vitkit does, so a flipped weight is not loaded."""
    model = _model(weights_fuzzer)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    good = (tmp_path / "w.pth").read_bytes()
    info = max(zipfile.ZipFile(tmp_path / "w.pth").infolist(), key=lambda i: i.file_size)
    data = bytearray(good)
    data[_member_data_offset(good, info) + 8] ^= 0x01
    (tmp_path / "w.pth").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is damaged \(member .* fails its CRC-32"):
        load_pretrained(tmp_path / "w.pth", num_heads=2)
    (tmp_path / "w.pth").write_bytes(good)
    assert _same_weights(load_pretrained(tmp_path / "w.pth", num_heads=2), model)


def test_safetensors_header_claiming_huge_sizes_is_damaged(weights_fuzzer, tmp_path):
    save_file(_model(weights_fuzzer).state_dict(), tmp_path / "ok.safetensors")
    good = (tmp_path / "ok.safetensors").read_bytes()
    rng = np.random.default_rng(1)
    for attempt in range(6):
        path = tmp_path / f"huge{attempt}.safetensors"
        path.write_bytes(weights_fuzzer.huge_safetensors_header(good, rng))
        with pytest.raises(CheckpointError, match="is damaged"):
            load_pretrained(path, num_heads=2)


def _hf_folder(weights_fuzzer: ModuleType, folder: Path) -> dict:
    seed = weights_fuzzer.make_seed("hf_folder")
    seed.write(seed.tensors, seed.config, folder)
    return seed.config


def test_hf_config_with_a_wrong_type_names_key_and_type(weights_fuzzer, tmp_path):
    pytest.importorskip("transformers")
    config = _hf_folder(weights_fuzzer, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "hidden_size": "16"}))
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "hf")
    says(refused.value, "'hidden_size'", "'16'", "an integer")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))  # fixed as told
    assert load_pretrained(tmp_path / "hf").config.width == 16


def test_config_describing_a_far_larger_model_is_refused(weights_fuzzer, tmp_path):
    pytest.importorskip("transformers")
    config = _hf_folder(weights_fuzzer, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(
        json.dumps({**config, "num_hidden_layers": 1 << 40}))
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "hf")
    says(refused.value, "config", "does not belong to these weights")


# -- vitkit folders and training checkpoints: checksums -------------------------------------------
def test_vitkit_folder_checksum_catches_a_changed_tensor(weights_fuzzer, tmp_path):
    model = _model(weights_fuzzer)
    save_pretrained(model, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["tensors_sha256"] == tensors_checksum(model.state_dict())
    weights = tmp_path / "m" / "model.safetensors"
    good = weights.read_bytes()
    data = bytearray(good)
    data[-5] ^= 0x01  # the last tensor's bytes: safetensors itself cannot tell
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path / "m")
    says(refused.value, "damaged", "sha256 checksum")
    weights.write_bytes(good)
    assert _same_weights(load_pretrained(tmp_path / "m"), model)
    del meta["tensors_sha256"]  # folders written before checksums still read
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    assert _same_weights(load_pretrained(tmp_path / "m"), model)


def test_vitkit_config_with_a_wrong_type_names_key_and_type(weights_fuzzer, tmp_path):
    save_pretrained(_model(weights_fuzzer), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    meta = json.loads(path.read_text())
    for broken, pattern in (({**meta, "model": {**meta["model"], "depth": "one"}}, "depth"),
                            ({**meta, "preprocess": {**meta["preprocess"], "mean": "grey"}},
                             "preprocess.mean"),
                            ({**meta, "class_names": [1, 2]}, "'class_names' is \\[1, 2\\], "
                             "expected a list of strings")):
        path.write_text(json.dumps(broken))
        with pytest.raises(CheckpointError, match=pattern) as info:
            load_pretrained(tmp_path / "m")
        assert str(path) in str(info.value)
    path.write_text(json.dumps(meta))
    assert load_pretrained(tmp_path / "m").config.depth == 1


def _train_state(weights_fuzzer: ModuleType) -> dict:
    seed = weights_fuzzer.make_seed("train_checkpoint")
    return {**seed.config, "model": seed.tensors}


def test_training_checkpoint_checksum_catches_a_changed_tensor(weights_fuzzer, tmp_path):
    state = _train_state(weights_fuzzer)
    assert state["checksum"] == tensors_checksum(
        {f"model.{k}": v for k, v in state["model"].items()})
    path = tmp_path / "last.pt"
    changed = {**state, "model": {**state["model"]}}
    changed["model"]["head.bias"] = changed["model"]["head.bias"] + 1e-3
    torch.save(changed, path)  # a valid file (CRCs fine) whose weights are not those saved
    with pytest.raises(CheckpointError) as refused:
        read_weights(path)
    says(refused.value, "last.pt", "damaged", "model and EMA tensors")

    with pytest.raises(CheckpointError, match="is damaged"):
        read_checkpoint(path)  # what resuming reads
    torch.save(state, path)
    assert torch.equal(read_weights(path).state_dict["head.bias"], state["model"]["head.bias"])
    torch.save({k: v for k, v in state.items() if k != "checksum"}, path)  # older files
    assert read_checkpoint(path).trained.model.keys() == state["model"].keys()


def test_training_checkpoint_with_wrong_forms_is_damaged_not_a_raw_error(weights_fuzzer,
                                                                         tmp_path):
    state = _train_state(weights_fuzzer)
    for key, value in (("position", [1, 2]), ("rng", None), ("weights", "best"),
                       ("model_config", {**state["model_config"], "width": "wide"})):
        torch.save({**state, key: value}, tmp_path / "last.pt")
        with pytest.raises(CheckpointError, match=r"last\.pt"):
            read_checkpoint(tmp_path / "last.pt")


def test_only_vitkit_errors_escape_read_weights_on_random_files(tmp_path):
    rng = np.random.default_rng(0)
    for index in range(40):
        path = tmp_path / f"r{index}.bin"
        path.write_bytes(bytes([rng.choice([0x80, 0x50, 0x7B, 0])]) + rng.bytes(
            int(rng.integers(0, 300))))
        with pytest.raises(VitkitError):
            read_weights(path)


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
