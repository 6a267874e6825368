"""
One small, explicit config loader shared by train.py, sample.py, model.py and the studies, in place of
nanoGPT's exec-into-globals configurator. train.settle_config settles a run's whole config with it.

    python train.py config/tiny_mesh.py --batch_size=8 --learning_rate=3e-4 --compile=False

Positional `*.py` files are plain Python assignments, run in order; then `--key=value` overrides.
Every key must name a field of one of the given dataclasses (GPTConfig, TrainConfig, ...): a typo
is an error with a suggestion, not a silently ignored global as in nanoGPT's configurator.
"""

import ast
import dataclasses
import difflib
import inspect
import math
import re
import runpy
import sys
import types
import typing

from support.compat import RENAMED_FIELDS
from support.config import ConfigError, check_ranges  # noqa: F401 (the scripts import them from here too)


def _coerce(key, value, tp, where):
    """Return `value` as type `tp` (int -> float allowed, 'true'/'false' -> bool, None for Optional)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg, where)
            except ConfigError:
                pass
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


def _comments(cls):
    """{field: its end-of-line comment in the class source}, for --help; {} if the source is unavailable."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return dict(re.findall(r"^\s+(\w+)\s*:[^#\n]*#\s*(.*)$", source, flags=re.M))


def print_help(classes):
    """Print every field of every dataclass with its type, default and comment."""
    print("usage: python <script>.py [config/<name>.py ...] [--key=value ...]\n")
    for cls in classes:
        comments, hints = _comments(cls), typing.get_type_hints(cls)
        print(f"{cls.__name__}:")
        for f in dataclasses.fields(cls):
            tp = _type_name(hints[f.name])
            default = f.default
            comment = f"  # {comments[f.name]}" if f.name in comments else ""
            print(f"  --{f.name}={default!r}  ({tp}){comment}")
        print()


def load_config(argv, *classes, skip_unknown=False, defer=()):
    """Build one instance of each dataclass in `classes` from config files and --key=value overrides.

    argv: e.g. sys.argv[1:]: `*.py` config files (run in order, names starting with '_' and
    modules/functions/classes skipped), then or among them `--key=value` (split on the first '=',
    value parsed with ast.literal_eval, or taken as a raw string when that fails), `--help`.
    classes: dataclasses (GPTConfig, TrainConfig, ...); each key goes to the one that has that field.
    Each is built as cls(**its overrides), never by dataclasses.replace: GPTConfig.__post_init__ fills
    in defaults that depend on other fields (mlp_hidden = 4*n_embd, ...), which a copy would freeze.
    skip_unknown: skip the keys no class has, e.g. the training keys of a config file read by
    `python model.py` (which must not import train.py); a key within a typo of a field (difflib ratio
    >= 0.8, e.g. 'n_layers') is still an error.
    defer: classes returned as their {key: value} overrides instead of an instance, for a caller that
    builds them on other defaults (train.py's GPTConfig on a released model's config, --init_from=hf:...).
    Returns (instances, given): a list of instances, one per class, in order, and the set of the keys
    the user set, in a config file or on the command line. `given` is the only record of what was set:
    a value equal to the default may have been given, so never compare with the defaults to find out.
    `--help` prints all fields and exits 0.
    Raises ConfigError for an unknown key (with a close match), a wrong type, a bad argument, or an
    invalid value or combination that a dataclass's __post_init__ rejects with ValueError.
    """
    hints = [typing.get_type_hints(cls) for cls in classes]
    owner = {f.name: i for i, cls in enumerate(classes) for f in dataclasses.fields(cls)}
    if len(owner) < sum(len(dataclasses.fields(cls)) for cls in classes):
        raise TypeError(
            f"two of {[cls.__name__ for cls in classes]} share a field name: a key must have one owner"
        )
    overrides = [{} for _ in classes]

    spellings = {}                            # key -> {the name it was given under: (value, where)}

    def assign(key, value, where, raw=None):
        name = key
        if key in RENAMED_FIELDS and RENAMED_FIELDS[key] in owner:    # an old name: read under the new one
            print(f"note: config key '{key}' in {where} is now called '{RENAMED_FIELDS[key]}' (the same "
                  f"setting)", file=sys.stderr)
            key = RENAMED_FIELDS[key]
        spellings.setdefault(key, {})[name] = (value, where)
        if len(spellings[key]) > 1 and len({repr(v) for v, _ in spellings[key].values()}) > 1:
            given = " and ".join(f"{n}={v!r} ({w})" for n, (v, w) in spellings[key].items())
            raise ConfigError(f"{given} name one setting with two values: give it once")
        if key not in owner:
            close = difflib.get_close_matches(key, owner, n=1, cutoff=0.8 if skip_unknown else 0.6)
            if skip_unknown and not close:
                return
            raise ConfigError(
                f"unknown config key '{key}' in {where}" + (f" (did you mean '{close[0]}'?)" if close else "")
            )
        i = owner[key]
        try:
            overrides[i][key] = _coerce(key, value, hints[i][key], where)
        except ConfigError:
            if raw is None or raw == value:
                raise
            try:                              # a CLI string field may look like a literal: --dataset=123
                overrides[i][key] = _coerce(key, raw, hints[i][key], where)
            except ConfigError:
                raise ConfigError(
                    f"{key}={value!r} ({where}): expected {_type_name(hints[i][key])}"
                ) from None

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
                if not key.startswith("_") and not isinstance(
                    value, (types.ModuleType, types.FunctionType, type)
                ):
                    assign(key, value, arg)
        else:
            raise ConfigError(f"argument '{arg}' is neither a config file (*.py) nor --key=value")
    try:
        instances = [o if cls in defer else cls(**o) for cls, o in zip(classes, overrides)]
    except ValueError as e:                   # e.g. GPTConfig: n_embd must divide by n_head
        raise ConfigError(str(e)) from None
    return instances, {key for o in overrides for key in o}


def given_values(given, *instances) -> dict:
    """{key: value} of the keys in `given` (load_config's record), in field order: what the user set."""
    return {
        f.name: getattr(cfg, f.name) for cfg in instances for f in dataclasses.fields(cfg) if f.name in given
    }
