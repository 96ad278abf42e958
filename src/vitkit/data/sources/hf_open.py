"""Where a `data=hf:SPEC` dataset comes from: SPEC -> its splits, as Hugging Face `datasets`.

SPEC is tried, in this order, as
1. a `save_to_disk` folder (a Dataset or a DatasetDict): `datasets.load_from_disk`;
2. a glob of parquet / arrow files, or one such file: splits from the file names, by the rules
   `datasets` applies to data files (train-*.parquet, data/test-00000-of-00001.parquet ...);
3. a folder of parquet / arrow files or of images (class sub-folders, or train/ and test/ each
   with class sub-folders): `datasets.load_dataset(folder)`, which infers the builder;
4. a Hub dataset name ("beans", "uoft-cs/cifar10"): `datasets.load_dataset(name)`. Offline
   (HF_DATASETS_OFFLINE=1 or HF_HUB_OFFLINE=1), datasets 5.2 reads only its own prepared cache
   (HF_DATASETS_CACHE/<org>___<name>/...), not the huggingface_hub file cache.

Every failure of `datasets` becomes a `DataError` that says what to do.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from datasets.data_files import DataFilesDict, get_data_patterns
from datasets.exceptions import DatasetNotFoundError

from vitkit.errors import DataError
from vitkit.network import hub_unreachable

__all__ = ["HFSplits", "datasets_cache_dir", "hold_out_command", "open_hf_splits"]

# split name -> a map-style Dataset, or an IterableDataset when streaming (a save_to_disk folder
# stays a Dataset: the caller streams it with `to_iterable_dataset`)
HFSplits = dict[str, Dataset | IterableDataset]

_FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}
_OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
_LOCAL_CHOICES = ("a save_to_disk folder, a folder or glob of parquet/arrow files, or an image "
                  "folder (class sub-folders, or train/ and test/ each with class sub-folders)")


def datasets_cache_dir() -> str:
    """Where `datasets` keeps prepared sets: HF_DATASETS_CACHE, else HF_HOME/datasets."""
    return str(datasets.config.HF_DATASETS_CACHE)


def _offline_variables() -> list[str]:
    set_here = [name for name in _OFFLINE_VARIABLES
                if os.environ.get(name, "").upper() in datasets.config.ENV_VARS_TRUE_VALUES]
    return set_here or (["HF_HUB_OFFLINE"] if datasets.config.HF_HUB_OFFLINE else [])


def _as_splits(loaded: object, spec: str) -> HFSplits:
    if isinstance(loaded, (DatasetDict, IterableDatasetDict)):
        return {str(split): part for split, part in loaded.items()}
    if isinstance(loaded, (Dataset, IterableDataset)):  # one save_to_disk'd split
        return {str(loaded.split) if loaded.split else "train": loaded}
    raise DataError(f"hf:{spec} loaded as {type(loaded).__name__}, not a dataset")


def _split_files(files: list[str]) -> dict[str, list[str]]:
    """Files grouped by the split their names state, as `datasets` groups data files."""
    base = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    wanted = {os.path.abspath(f) for f in files}
    try:
        resolved = DataFilesDict.from_patterns(get_data_patterns(base), base_path=base)
    except Exception:  # no split named in any file name: one "train" split
        resolved = {}
    grouped = {str(split): sorted(f for f in found if os.path.abspath(f) in wanted)
               for split, found in resolved.items()}
    grouped = {split: found for split, found in grouped.items() if found}
    return grouped or {"train": sorted(wanted)}


def _load_files(spec: str, files: list[str], streaming: bool) -> HFSplits:
    kinds = {Path(f).suffix.lower() for f in files}
    if not files or not kinds <= set(_FILE_BUILDERS) or len(kinds) != 1:
        found = ", ".join(sorted(kinds)) or "no files"
        raise DataError(f"hf:{spec} matches {found}: a glob must match parquet or arrow files "
                        f"(one kind), e.g. hf:'/data/beans/train-*.parquet'")
    builder = _FILE_BUILDERS[kinds.pop()]
    return _as_splits(datasets.load_dataset(builder, data_files=_split_files(files),
                                            streaming=streaming), spec)


def _load_folder(spec: str, folder: Path, streaming: bool) -> HFSplits:
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        return _as_splits(datasets.load_from_disk(str(folder)), spec)  # streamed by the caller
    try:
        return _as_splits(datasets.load_dataset(str(folder), streaming=streaming), spec)
    except (FileNotFoundError, datasets.exceptions.DataFilesNotFoundError,
            datasets.data_files.EmptyDatasetError) as err:
        raise DataError(f"hf:{spec}: the folder {folder} holds no data `datasets` can read "
                        f"({err}); pass {_LOCAL_CHOICES}") from err


def _offline_message(spec: str) -> str:
    variables = _offline_variables() or ["HF_HUB_OFFLINE"]
    settings, names = " and ".join(f"{v}=1" for v in variables), " and ".join(variables)
    cache = datasets_cache_dir()
    return (f"hf:{spec}: the Hugging Face dataset {spec!r} is not in the datasets cache "
            f"({cache}) and downloads are off ({settings}). Either unset {names} so "
            f"`datasets` downloads it into {cache} (HF_DATASETS_CACHE, else HF_HOME/datasets); "
            f"or, while online, run python -c \"import datasets; datasets.load_dataset('{spec}')\" "
            f"with the same HF_HOME / HF_DATASETS_CACHE; or download the files (hf download "
            f"{spec} --repo-type dataset --local-dir DIR) and pass data=hf:DIR, or any local "
            f"copy: {_LOCAL_CHOICES}")


@contextmanager
def _offline_for_now() -> Iterator[None]:
    """`datasets` (and the huggingface_hub it calls) offline for one call: its prepared cache
    only, without waiting through retries for a Hub that does not answer."""
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _load_hub(spec: str, streaming: bool) -> HFSplits:
    unreachable = None if _offline_variables() else hub_unreachable()
    if unreachable:
        try:
            with _offline_for_now():
                return _as_splits(datasets.load_dataset(spec, streaming=streaming), spec)
        except (ConnectionError, FileNotFoundError, DatasetNotFoundError) as err:
            raise DataError(
                f"hf:{spec}: the Hugging Face Hub cannot be reached ({unreachable}) and "
                f"{spec!r} is not in the datasets cache ({datasets_cache_dir()}). Check the "
                f"network (or HF_ENDPOINT), or pass {_LOCAL_CHOICES}") from err
    try:
        return _as_splits(datasets.load_dataset(spec, streaming=streaming), spec)
    except DatasetNotFoundError as err:
        raise DataError(f"hf:{spec}: no dataset {spec!r} on the Hugging Face Hub, or it is "
                        f"private or gated ({err}). Check the name at "
                        f"https://huggingface.co/datasets?search={spec.split('/')[-1]}; for a "
                        f"private or gated set run `hf auth login`; for local data pass "
                        f"{_LOCAL_CHOICES}") from err
    except ConnectionError as err:
        if _offline_variables():
            raise DataError(_offline_message(spec)) from err
        raise DataError(f"hf:{spec}: cannot reach the Hugging Face Hub ({err}); check the "
                        f"network (or HF_ENDPOINT), or pass {_LOCAL_CHOICES}") from err
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        raise DataError(f"hf:{spec}: `datasets` cannot load it: {err}") from err


def _load_expression(spec: str, split: str) -> str:
    """Python that loads the `split` of `spec` as one `datasets.Dataset`, as `open_hf_splits`
    finds it."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return f"datasets.load_from_disk({str(path)!r})[{split!r}]"
    if path.is_dir() and (path / "state.json").is_file():
        return f"datasets.load_from_disk({str(path)!r})"
    if glob.has_magic(spec) or path.is_file():
        builder = _FILE_BUILDERS.get(Path(spec).suffix.lower(), "parquet")
        return (f"datasets.load_dataset({builder!r}, data_files={os.path.expanduser(spec)!r}, "
                f"split={split!r})")
    return f"datasets.load_dataset({spec!r}, split={split!r})"


def hold_out_command(spec: str, split: str = "train", fraction: float = 0.1
                     ) -> tuple[str, str]:
    """A shell command that holds out `fraction` of `spec`'s `split` as a "validation" split
    and saves both with `save_to_disk` (a set with a training split only has nothing to
    evaluate on), and the folder it saves to, which data=hf:FOLDER then reads. The folder is
    beside `spec`'s own (`save_to_disk` cannot replace the folder it reads from)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        base = path.absolute()
    elif glob.has_magic(spec) or path.is_file():  # the folder of the files
        base = Path(os.path.dirname(re.split(r"[*?[]", os.path.expanduser(spec))[0]))
        base = base.absolute()
    else:  # a Hub name: a folder in the current one
        base = Path.cwd() / spec.split("/")[-1]
    folder = f"{base}-{split}-validation"
    code = (f"import datasets; parts = {_load_expression(spec, split)}.train_test_split("
            f"test_size={fraction}, seed=0); datasets.DatasetDict({{{split!r}: parts['train'], "
            f"'validation': parts['test']}}).save_to_disk({folder!r})")
    return f'python -c "{code}"', folder


def _looks_like_path(spec: str) -> bool:
    return (spec.startswith(("/", ".", "~")) or spec.count("/") > 1
            or os.sep in spec.replace("/", "") or Path(spec).suffix.lower() in _FILE_BUILDERS)


def open_hf_splits(spec: str, streaming: bool = False) -> HFSplits:
    """Every split of `spec` (what follows "hf:"), by the rules in this module's docstring."""
    if not spec:
        raise DataError("data=hf: needs a dataset after the colon: a Hub name (hf:beans) or "
                        f"a local path; pass {_LOCAL_CHOICES}")
    path = Path(spec).expanduser()
    try:
        if glob.has_magic(spec):
            return _load_files(spec, sorted(glob.glob(os.path.expanduser(spec), recursive=True)),
                               streaming)
        if path.is_dir():
            return _load_folder(spec, path, streaming)
        if path.is_file():
            return _load_files(spec, [str(path)], streaming)
    except DataError:
        raise
    except (OSError, ValueError, RuntimeError) as err:  # damaged or foreign files
        raise DataError(f"hf:{spec}: `datasets` cannot read {path}: {err}; pass "
                        f"{_LOCAL_CHOICES}") from err
    if _looks_like_path(spec):
        raise DataError(f"hf:{spec}: no such file or folder ({path.absolute()}); pass "
                        f"{_LOCAL_CHOICES}, or a Hub dataset name such as hf:beans")
    return _load_hub(spec, streaming)
