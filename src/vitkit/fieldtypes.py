"""Config values typed by their dataclass annotations: one check for JSON, CLI and Python.

`check_value` checks a value from JSON or Python against a field's annotation, converting
where nothing can be lost (a list to a tuple, 4.0 to 4, 224 to a (224, 224) image size).
`parse_text` reads a `KEY=VALUE` override from the command line by the field's type, so
"False" is false for a bool field and "60x100" is an image size. Anything else is a
`ConfigError` that names the key, the value and the type the field takes.
`did_you_mean` (a few close words) and `closest_path` (a path that does not exist, corrected
part by part against its folders' entries) are the one did-you-mean of every message.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import numpy as np

from vitkit.errors import ConfigError

__all__ = ["ImageSize", "check_fields", "check_value", "close_matches", "closest_path",
           "describe", "did_you_mean", "field_types", "parse_size", "parse_text"]


class _SizeMark:
    """Marks a `tuple[int, int]` field that also takes 224 or "60x100"."""

    def __repr__(self) -> str:
        return "image size"


SIZE = _SizeMark()
# (height, width); also written 224 (square), "60x100", "60,100" or [60, 100].
ImageSize = Annotated[tuple[int, int], SIZE]

TRUE_WORDS = ("true", "yes", "1")
FALSE_WORDS = ("false", "no", "0")
NONE_WORDS = ("null", "none")
_INVALID = object()  # what a converter returns for a value its type does not take
_SIZE_TEXT = re.compile(r"^\s*(\d+)\s*(?:[x,]\s*(\d+)\s*)?$", re.IGNORECASE)


@functools.cache
def field_types(owner: type) -> dict[str, Any]:
    """Each field's resolved annotation (with `Annotated` marks kept)."""
    hints = typing.get_type_hints(owner, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(owner)}


def field_type(owner: type, name: str, what: str) -> Any:
    """The annotation of field `name`; an unknown name is refused with a hint."""
    types_ = field_types(owner)
    if name not in types_:
        check_known_keys(owner, {name: None}, what)
    return types_[name]


def check_fields(instance: Any, prefix: str = "") -> None:
    """Check and convert every field of a dataclass instance in place (in `__post_init__`)."""
    owner = type(instance)
    for name, annotation in field_types(owner).items():
        value = getattr(instance, name)
        checked = _checked(annotation, value, f"{prefix}{name}", owner, name)
        if checked is not value:
            object.__setattr__(instance, name, checked)


def check_value(owner: type, name: str, value: Any, label: str | None = None,
                what: str = "config") -> Any:
    """`value` (from JSON or Python) converted to field `name`'s type, or a ConfigError."""
    return _checked(field_type(owner, name, what), value, label or name, owner, name)


def parse_text(owner: type, name: str, text: str, label: str | None = None,
               what: str = "config") -> Any:
    """A command-line value for field `name`, read by the field's type."""
    annotation = field_type(owner, name, what)
    value = _convert(annotation, text, from_text=True)
    if value is _INVALID:
        raise _type_error(annotation, text, label or name, owner, name, from_text=True)
    return value


def parse_size(text: str) -> tuple[int, int] | None:
    """"224" -> (224, 224); "60x100", "60,100" or "[60, 100]" -> (60, 100); else None."""
    value = _size(text, from_text=True)
    return None if value is _INVALID else value


def describe(annotation: Any) -> str:
    """What a type takes, in words: "an integer", "true or false", "a list of numbers"."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return "an image size (224, or HxW like 60x100)" if SIZE in args[1:] else \
            describe(args[0])
    if origin in (Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    if origin in (tuple, list):
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {_plural(args[0])}"
        if len(set(args)) == 1:
            return f"a list of {len(args)} {_plural(args[0])}"
        return "a list of " + ", ".join(describe(arg) for arg in args)
    if origin is dict:
        return "a JSON object of keys and values"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(annotation, "a value")


# -- checking ----------------------------------------------------------------------------------
def _checked(annotation: Any, value: Any, label: str, owner: type, name: str) -> Any:
    checked = _convert(annotation, value, from_text=False)
    if checked is _INVALID:
        raise _type_error(annotation, value, label, owner, name, from_text=False)
    return checked


def _type_error(annotation: Any, value: Any, label: str, owner: type, name: str,
                from_text: bool) -> ConfigError:
    """"depth='two' is not valid: depth takes an integer; for example depth=12"."""
    example = _example(owner, name, annotation)
    base = _base(annotation)
    if from_text:
        hint = f"; for example {label}={_as_text(example, base)}" if example is not None else ""
        if base is bool:
            hint += " (true/false, yes/no and 1/0 are accepted)"
    else:
        hint = f" (for example {json.dumps(_as_json(example))})" if example is not None else ""
    return ConfigError(f"{label}={value!r} is not valid: {label} takes {describe(annotation)}"
                       + hint)


def _base(annotation: Any) -> Any:
    """The annotation without None and Annotated marks (`bool | None` -> bool)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return annotation if SIZE in args[1:] else _base(args[0])
    if origin in (Union, types.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        return _base(rest[0]) if len(rest) == 1 else annotation
    return annotation


def _example(owner: type, name: str, annotation: Any) -> Any:
    """The field's default as an example value (a generic one when the default is empty)."""
    field = next(f for f in dataclasses.fields(owner) if f.name == name)
    default = field.default
    if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    if default is dataclasses.MISSING or default is None or default in ("", (), [], {}):
        return _generic_example(_base(annotation))
    return default


def _generic_example(annotation: Any) -> Any:
    """A value of a scalar type or a tuple of scalars, or None when there is no simple one."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is tuple and args:
        items = [args[0]] if args[-1] is Ellipsis else list(args)
        values = [_generic_example(item) for item in items]
        return None if None in values or get_origin(items[0]) else tuple(values)
    return {int: 1, float: 0.5, bool: True}.get(annotation)


def _as_text(value: Any, base: Any) -> str:
    """A value written as on the command line: true, 0.001, 60x100, [0.9,0.999]."""
    if get_origin(base) is Annotated and isinstance(value, tuple):
        return str(value[0]) if value[0] == value[1] else f"{value[0]}x{value[1]}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _as_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _plural(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (tuple, list):
        return describe(annotation).replace("a list of", "lists of", 1)
    return {bool: "true/false values", int: "integers", float: "numbers",
            str: "strings"}.get(annotation, "values")


# -- converters: each returns the converted value or _INVALID -------------------------------------
def _convert(annotation: Any, value: Any, from_text: bool) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _size(value, from_text) if SIZE in args[1:] else \
            _convert(args[0], value, from_text)
    if origin in (Union, types.UnionType):
        return _union(args, value, from_text)
    if origin in (tuple, list):
        return _sequence(origin, args, value, from_text)
    if origin is dict or annotation is dict:
        return _mapping(value, from_text)
    if annotation is Any:
        return _json_or_text(value) if from_text else value
    if annotation is type(None):
        if from_text:
            return None if value.strip().lower() in NONE_WORDS else _INVALID
        return None if value is None else _INVALID
    scalar = {bool: _bool, int: _int, float: _float, str: _str}.get(annotation)
    return scalar(value, from_text) if scalar else value


def _union(members: tuple[Any, ...], value: Any, from_text: bool) -> Any:
    none_ok = type(None) in members
    if none_ok and (value is None or (from_text and value.strip().lower() in NONE_WORDS)):
        return None
    # A string member takes any text, so it is tried last.
    ordered = sorted((m for m in members if m is not type(None)), key=lambda m: m is str)
    for member in ordered:
        converted = _convert(member, value, from_text)
        if converted is not _INVALID:
            return converted
    return _INVALID


def _bool(value: Any, from_text: bool) -> Any:
    if from_text:
        word = value.strip().lower()
        return True if word in TRUE_WORDS else False if word in FALSE_WORDS else _INVALID
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    return _INVALID


def _int(value: Any, from_text: bool) -> Any:
    if from_text:
        text = value.strip()
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else _INVALID
    if isinstance(value, bool):
        return _INVALID
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return _INVALID


def _float(value: Any, from_text: bool) -> Any:
    if from_text:
        as_int = _int(value, from_text=True)
        if as_int is not _INVALID:
            return as_int
        try:
            value = float(value.strip())
        except ValueError:
            return _INVALID
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return _INVALID
    if not math.isfinite(value):
        return _INVALID
    return value if isinstance(value, int) else float(value)


def _loads(text: str) -> Any:
    """`json.loads`, with nesting too deep for Python refused as a ConfigError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"the value {text[:40]}... nests too deeply to read: give a flat "
                          "value (a number, a name, or a list or object a few levels "
                          "deep)") from None


def _str(value: Any, from_text: bool) -> Any:
    if from_text:
        text = value.strip()
        if text.startswith('"'):  # a JSON-quoted string ("runs/x")
            try:
                decoded = _loads(text)
            except json.JSONDecodeError:
                return value
            return decoded if isinstance(decoded, str) else value
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return _INVALID


def _size(value: Any, from_text: bool) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return _size(_loads(text), from_text=False)
            except json.JSONDecodeError:
                return _INVALID
        match = _SIZE_TEXT.match(text)
        if match is None:
            return _INVALID
        height = int(match.group(1))
        return (height, int(match.group(2) or height))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        sides = [_int(v, from_text=False) for v in value]
        return _INVALID if _INVALID in sides else (sides[0], sides[1])
    return _INVALID


def _sequence(origin: type, args: tuple[Any, ...], value: Any, from_text: bool) -> Any:
    if from_text:
        text = value.strip()
        if text.startswith("["):
            try:
                value, from_text = _loads(text), False
            except json.JSONDecodeError:
                return _INVALID
        else:  # "0.5,0.5,0.5" or a single "0.5"
            value = [part for part in text.split(",") if part.strip()] if text else []
    if not isinstance(value, (list, tuple)):
        return _INVALID
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        item_types = [args[0]] * len(value)
    elif len(args) == len(value):
        item_types = list(args)
    else:
        return _INVALID
    items = [_convert(t, v, from_text) for t, v in zip(item_types, value, strict=True)]
    if any(item is _INVALID for item in items):
        return _INVALID
    return tuple(items) if origin is tuple else list(items)


def _mapping(value: Any, from_text: bool) -> Any:
    if from_text:
        try:
            value = _loads(value)
        except json.JSONDecodeError:
            return _INVALID
    return dict(value) if isinstance(value, dict) else _INVALID


def _json_or_text(text: str) -> Any:
    """For `Any` fields: a JSON object or list when the text is one, else the text."""
    if text.strip().startswith(("{", "[")):
        try:
            return _loads(text)
        except json.JSONDecodeError:
            pass
    return _str(text, from_text=True)


def check_known_keys(dataclass_type: type, data: dict[str, Any], what: str,
                     peer_names: dict[str, str] | None = None) -> None:
    """Refuse keys that are not fields of `dataclass_type`, suggesting the closest ones, or
    for another library's name of a field (`peer_names`: timm's "embed_dim" is "width"),
    that field."""
    known = {f.name for f in dataclasses.fields(dataclass_type)}
    unknown = sorted(set(data) - known)
    if unknown:
        peers = peer_names or {}
        hints = "".join(f" For {key}, use {peers[key]}." if key in peers
                        else did_you_mean(key, known) for key in unknown)
        raise ConfigError(f"unknown {what} key(s) {', '.join(unknown)}.{hints} "
                          f"Valid keys: {', '.join(sorted(known))}.")


def close_matches(word: str, choices: Any, n: int = 3) -> list[Any]:
    """The (at most `n`) choices closest to `word`, best first; case is ignored when that
    alone finds none."""
    choices = list(choices)
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=n, cutoff=0.5)
    if not close:
        upper = difflib.get_close_matches(word.upper(), [str(c).upper() for c in choices], n=n,
                                          cutoff=0.5)
        close = [str(c) for c in choices if str(c).upper() in upper]
    by_text = {str(c): c for c in choices}
    return [by_text[c] for c in close]


def did_you_mean(word: str, choices: Any) -> str:
    """" Did you mean 'a' or 'b'?" for the closest few of `choices`, or "" when none is."""
    close = close_matches(word, choices)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def closest_path(path: str | Path) -> Path | None:
    """The existing path `path` most likely meant ("runs/digit" -> "runs/digits"): each part
    that does not exist is replaced by the closest entry of the folder above it. None when
    some part has no close entry (or `path` exists)."""
    path = Path(path).expanduser()
    if path.exists():
        return None
    guess = Path(path.anchor) if path.is_absolute() else Path()
    for part in path.parts[1 if path.is_absolute() else 0:]:
        if (guess / part).exists():
            guess = guess / part
            continue
        entries = sorted(entry.name for entry in guess.iterdir()) if guess.is_dir() else []
        close = close_matches(part, entries, n=1)
        if not close:
            return None
        guess = guess / close[0]
    return guess
