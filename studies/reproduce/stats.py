"""
Paired statistics: an arm against its baseline over paired seeds, the Student-t 95% interval of the mean
difference, and the verdict it supports. The t distribution is scipy.stats.t; nothing here depends on what
the values mean (final losses, probe numbers): it is the textbook paired t interval.
"""

import math

from scipy.stats import t as student_t


def t_quantile(p, df):
    """The p-quantile (p in (0.5, 1)) of Student's t with df degrees of freedom: t_quantile(0.975, 2) =
    4.3027, the multiplier of a two-sided 95% interval from 3 values."""
    if not 0.5 < p < 1:
        raise ValueError(f"p = {p} must be in (0.5, 1)")
    return float(student_t.ppf(p, df))


def t_two_sided(t, df):
    """P(|T| < t) for Student's t with df degrees of freedom and t >= 0: 1 - p, where p = 2 P(T > t) is the
    two-sided p-value of a t statistic t."""
    return float(1 - 2 * student_t.sf(t, df))


def mean_std(values):
    """(mean, sample std with n - 1; 0 for one value) of a list of numbers."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0


def paired_stats(arm, baseline, level=0.95):
    """Compare an arm with its baseline over paired seeds.

    arm, baseline: {seed: value}; only the seeds in both count (pairs). Returns a dict: n, seeds, mean and std
    (sample std, n - 1) of each side, the paired differences' mean diff = mean(arm - baseline) and std, the
    Student-t multiplier t = t_{(1+level)/2, n-1}, the interval ci = diff ± t · std / sqrt(n), its half_width,
    and excludes_zero. With fewer than 2 pairs the interval is None."""
    seeds = sorted(set(arm) & set(baseline))
    n = len(seeds)
    if n == 0:
        raise ValueError("no seed is in both arm and baseline")
    a, b = [arm[s] for s in seeds], [baseline[s] for s in seeds]
    d = [x - y for x, y in zip(a, b)]
    (ma, sa), (mb, sb), (md, sd) = mean_std(a), mean_std(b), mean_std(d)
    out = {"n": n, "seeds": seeds, "mean": ma, "std": sa, "baseline_mean": mb, "baseline_std": sb,
           "diff": md, "diff_std": sd, "t": None, "ci": None, "half_width": None, "excludes_zero": None}
    if n >= 2:
        t = t_quantile((1 + level) / 2, n - 1)
        half = t * sd / math.sqrt(n)
        out.update(
            t=t, ci=[md - half, md + half], half_width=half, excludes_zero=md - half > 0 or md + half < 0
        )
    return out


def verdict(stats, expected_sign):
    """'reproduced' when the interval excludes 0 on the paper's side (expected_sign -1: arm below baseline,
    +1: above), 'not reproduced' when it excludes 0 on the other side, else 'not resolvable at this scale'
    (also with fewer than 2 pairs)."""
    if stats is None or stats["ci"] is None or not stats["excludes_zero"]:
        return "not resolvable at this scale"
    return "reproduced" if (stats["diff"] > 0) == (expected_sign > 0) else "not reproduced"
