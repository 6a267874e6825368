"""
One small, explicit config loader shared by train.py, sample.py, model.py and the studies, in place of
nanoGPT's exec-into-globals configurator. train.settle_config settles a run's whole config with it.

    python train.py config/tiny_mesh.py --batch_size=8 --learning_rate=3e-4 --compile=False

Positional `*.py` files are plain Python assignments, run in order; then `--key=value` overrides.
Every key must name a field of one of the given dataclasses (GPTConfig, TrainConfig, ...): a typo
is an error with a suggestion, not a silently ignored global as in nanoGPT's configurator.
"""

import ast
import contextlib
import dataclasses
import difflib
import inspect
import re
import runpy
import sys
import types
import typing

from support.compat import RENAMED_FIELDS, renamed_value
from support.config import ConfigError  # noqa: F401 (the scripts import it from here too)


def _coerce(key, value, tp, where):
    """Return `value` as type `tp` (int -> float allowed, 'true'/'false' -> bool, None for Optional)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is not type(None):
                with contextlib.suppress(ConfigError):
                    return _coerce(key, value, arg, where)
    elif tp is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    elif tp is float and type(value) in (int, float):
        return float(value)
    elif type(value) is tp:      # exact type: a bool is not accepted as an int, nor an int as a str
        return value
    raise ConfigError(f"{key}={value!r} ({where}): expected {_type_name(tp)}")


def _type_name(tp):
    """'int', 'Optional[int]', ...: how --help and the errors name a field's type."""
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def print_help(classes):
    """Print every field of every dataclass with its type, default and end-of-line comment."""
    print("usage: python <script>.py [config/<name>.py ...] [--key=value ...]\n")
    for cls in classes:
        comments = dict(re.findall(r"^\s+(\w+)\s*:[^#\n]*#\s*(.*)$", inspect.getsource(cls), flags=re.M))
        print(f"{cls.__name__}:")
        for f in dataclasses.fields(cls):
            comment = f"  # {comments[f.name]}" if f.name in comments else ""
            print(f"  --{f.name}={f.default!r}  ({_type_name(typing.get_type_hints(cls)[f.name])}){comment}")
        print()


def load_config(argv, *classes, skip_unknown=False, defer=()):
    """(instances, given): one instance of each dataclass in `classes` (each key goes to the one with that
    field), built as cls(**its keys) from argv's `*.py` files (run in order; names starting with '_', modules,
    functions, classes skipped) and `--key=value` (ast.literal_eval, else the raw string); `given`, the keys
    set, is the only record of what was set (a default may have been). An old key or value (support.compat)
    is read as the new one, with a note. skip_unknown: skip keys no class has, but typos; defer: classes
    returned as their {key: value} (train.py builds GPTConfig on a released model's). Raises ConfigError."""
    hints = [typing.get_type_hints(cls) for cls in classes]
    owner = {f.name: i for i, cls in enumerate(classes) for f in dataclasses.fields(cls)}
    if len(owner) < sum(len(dataclasses.fields(cls)) for cls in classes):
        raise TypeError(f"two of {[cls.__name__ for cls in classes]} share a field name: a key must have one owner")
    overrides, spellings = [{} for _ in classes], {}      # spellings: key -> {name given: (value, where)}

    def assign(key, value, where, raw):
        name = key
        if RENAMED_FIELDS.get(key) in owner:              # an old name: read under the new one
            key = RENAMED_FIELDS[key]
            print(f"note: config key '{name}' in {where} is now called '{key}' (the same setting)", file=sys.stderr)
        if key not in owner:
            close = difflib.get_close_matches(key, owner, n=1, cutoff=0.8 if skip_unknown else 0.6)
            if skip_unknown and not close:
                return
            raise ConfigError(f"unknown config key '{key}' in {where}" + (f" (did you mean '{close[0]}'?)" if close
                                                                          else ""))
        if renamed_value(key, value) != value:            # an old value: read as the new one
            print(f"note: {key} {value!r} in {where} is now {renamed_value(key, value)!r} (the same setting)",
                  file=sys.stderr)
            value = raw = renamed_value(key, value)
        spellings.setdefault(key, {})[name] = (value, where)
        if len({repr(v) for v, _ in spellings[key].values()}) > 1:
            given = " and ".join(f"{n}={v!r} ({w})" for n, (v, w) in spellings[key].items())
            raise ConfigError(f"{given} name one setting with two values: give it once")
        i = owner[key]
        try:
            overrides[i][key] = _coerce(key, value, hints[i][key], where)
        except ConfigError as error:
            try:                                          # a CLI string field may look like a literal: --dataset=123
                overrides[i][key] = _coerce(key, raw, hints[i][key], where)
            except ConfigError:
                raise error from None

    for arg in argv:
        if arg in ("-h", "--help"):
            print_help(classes)
            sys.exit(0)
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"argument '{arg}' must look like --key=value")
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw                   # unquoted strings: --dataset=pydoc
            assign(key, value, "command line", raw)
        elif arg.endswith(".py"):
            try:
                namespace = runpy.run_path(arg)
            except OSError as e:
                raise ConfigError(f"cannot read config file {arg}: {e.strerror}") from None
            for key, value in namespace.items():
                if not key.startswith("_") and not isinstance(value, (types.ModuleType, types.FunctionType, type)):
                    assign(key, value, arg, value)
        else:
            raise ConfigError(f"argument '{arg}' is neither a config file (*.py) nor --key=value")
    try:
        instances = [o if cls in defer else cls(**o) for cls, o in zip(classes, overrides)]
    except ValueError as e:                   # e.g. GPTConfig: n_embd must divide by n_head
        raise ConfigError(str(e)) from None
    return instances, {key for o in overrides for key in o}


def given_values(given, *instances) -> dict:
    """{key: value} of the keys in `given` (load_config's record), in field order: what the user set."""
    return {f.name: getattr(cfg, f.name) for cfg in instances for f in dataclasses.fields(cfg) if f.name in given}
