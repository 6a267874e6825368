"""
What the scripts and support/ share about a config: ConfigError, the one-line error of a bad key or value,
and check_settings, the one check of a script's settings (TrainConfig, SampleConfig, the studies' configs).
The model checks its own settings and arguments (model.check); both say "<name> = <value> must be <what is
valid>".
"""

import ast
import dataclasses
import math


class ConfigError(ValueError):
    """A bad config key or value; the scripts print it as one line `error: ...` and exit non-zero."""


def check_settings(cfg, valid):
    """Raise ValueError "<name> = <value> must be <what is valid>" for the first field of the dataclass
    instance `cfg` that `valid` refuses. valid: {field: a tuple of the allowed values, or a range '>= a',
    '> a', '[a, b]', '[a, b)', '(a, b]' or '(a, b)'}. A float field must be finite, listed or not; None
    passes where the default is None (the message then says "or None")."""
    for f in dataclasses.fields(cfg):
        value, rule = getattr(cfg, f.name), valid.get(f.name)
        if isinstance(rule, tuple) and value not in rule:
            raise ValueError(f"{f.name} = {value!r} must be one of {', '.join(map(repr, rule))}")
        if isinstance(rule, tuple) or value is None or (rule is None and not isinstance(value, float)):
            continue
        finite = not isinstance(value, float) or math.isfinite(value)
        if not (finite and (rule is None or within(value, rule))):
            what = [] if finite else ["finite"]
            if rule is not None:
                what.append(("in " if rule[0] in "[(" else "") + rule)
            raise ValueError(f"{f.name} = {value!r} must be {' and '.join(what)}"
                             f"{' or None' if f.default is None else ''}")


def within(value, valid):
    """Whether the number `value` lies in the range `valid` (see check_settings)."""
    if valid.startswith(">"):
        op, bound = valid.split()
        return value >= ast.literal_eval(bound) if op == ">=" else value > ast.literal_eval(bound)
    low, high = (ast.literal_eval(bound.strip()) for bound in valid[1:-1].split(","))
    return (low <= value if valid[0] == "[" else low < value) and (
        value <= high if valid[-1] == "]" else value < high)
