"""
What the scripts and support/ share about a config: ConfigError, the one-line error of a bad key or value,
and check_ranges, the range check of a dataclass's numeric fields (TrainConfig, the studies' configs).
"""

import ast
import dataclasses
import math


class ConfigError(ValueError):
    """A bad config key or value; the scripts print it as one line `error: ...` and exit non-zero."""


def check_ranges(cfg, ranges):
    """Raise ValueError for the first field of the dataclass instance `cfg` outside its range, naming the
    value and the range, e.g. "rope_pct = 1.5 must be in [0, 1]".

    ranges: {field: range}, a range being '>= a', '> a', '[a, b]', '[a, b)', '(a, b]' or '(a, b)'.
    None passes (an Optional field left to its default; the message then says "or None"); nan and
    ±inf never pass.
    """
    for name, valid in ranges.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        finite = not isinstance(value, float) or math.isfinite(value)
        if not (finite and _within(value, valid)):
            optional = next(f for f in dataclasses.fields(cfg) if f.name == name).default is None
            raise ValueError(f"{name} = {value!r} must be {'' if finite else 'finite and '}"
                             f"{'in ' if valid[0] in '[(' else ''}{valid}{' or None' if optional else ''}")


def _within(value, valid):
    """Whether the number `value` lies in the range `valid` (see check_ranges)."""
    if valid.startswith(">"):
        op, bound = valid.split()
        bound = ast.literal_eval(bound)
        return value >= bound if op == ">=" else value > bound
    low, high = (ast.literal_eval(bound.strip()) for bound in valid[1:-1].split(","))
    return (low <= value if valid[0] == "[" else low < value) and (
        value <= high if valid[-1] == "]" else value < high
    )
