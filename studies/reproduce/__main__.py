"""
The command line: `python -m studies.reproduce [flags]` runs the study (the grid of protocol.py, trained
and resumed by runs.py, each run summarised by summary.py, assembled by tables.py and figures.py);
`python -m studies.reproduce plot | starts | tolerance ...` runs a subcommand (figures.py, jacobi.py).
The package's docstring (studies/reproduce/__init__.py) lists the commands.
"""

import argparse
import os
import re
import sys
import time
from dataclasses import asdict

import torch

from configurator import ConfigError
from studies.common import git_commit
from support.data import load_meta
from support.process import keeps_process_state
from support.runtime import RunError

from .figures import figures, plot_main
from .gap import main as gap_main
from .jacobi import starts_main, tolerance_main
from .protocol import FLOPS_PER_S, FULL, QUICK, Protocol, flops_per_token, make_grid
from .runs import Progress, est_seconds, load_summary, rounded, train_run, write_json
from .summary import summarize
from .tables import assemble, markdown


def study_args(argv):
    """The study's flags -> (args, the Protocol they select)."""
    p = argparse.ArgumentParser(
        prog="python -m studies.reproduce",
        description="Reproduce the MeSH and T²MLR papers' findings at laptop scale (see "
        "studies/reproduce/protocol.py). `python -m studies.reproduce plot ...` draws curves of any runs.",
    )
    p.add_argument(
        "--quick", action="store_true", help="toy grid, every path end to end in under 2 minutes (CI)"
    )
    p.add_argument("--plan", action="store_true", help="print the grid and its estimated time, run nothing")
    p.add_argument("--data_dir", default="data/fineweb_byte",
                   help="byte-token data (prepare_data.py, see studies/reproduce/__init__.py)")
    p.add_argument(
        "--out_dir", default=None, help="checkpoints; default out/reproduce (quick: out/reproduce_quick)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="folder for reproduce/<run>.json, reproduce.json and reproduce.md;"
        " default studies/results (quick: OUT_DIR/results)",
    )
    p.add_argument("--assets", default=None, help="figures; default studies/results/reproduce (quick: OUT_DIR/assets)")
    p.add_argument("--device", default="cpu", help="training device (evaluation and probes run on the CPU)")
    p.add_argument(
        "--only", default=None, help="run only the runs whose name matches this regular expression"
    )
    p.add_argument("--max_minutes", type=float, default=None, help="start no run that would end after this")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads; default torch's (quick: 1, fastest at " "toy size and immune to a busy machine)",
    )
    for key in ("mesh_steps", "t2mlr_steps", "mesh_seeds", "t2mlr_seeds"):
        p.add_argument(f"--{key}", type=int, default=None, help=f"override the protocol's {key}")
    args = p.parse_args(argv)
    pr = QUICK if args.quick else FULL
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    overrides = {k: getattr(args, k) for k in ("mesh_steps", "t2mlr_steps", "mesh_seeds", "t2mlr_seeds")
                 if getattr(args, k) is not None}
    if overrides:
        pr = Protocol(**(asdict(pr) | overrides | {"name": pr.name + "*"}))
    return args, pr


def print_plan(selected, estimates, pr):
    """--plan: every selected run with its steps, GFLOP per step and estimated minutes, and the totals."""
    print(f"{'run':34s} {'steps':>6s} {'GFLOP/step':>10s} {'est. min':>8s}")
    for r in selected:
        print(f"{r.name:34s} {r.steps:6d} {flops_per_token(r.model) * pr.total_batch_size / 1e9:10.1f} "
              f"{estimates[r.name] / 60:8.2f}")
    for study in ("mesh", "t2mlr"):
        tot = sum(estimates[r.name] for r in selected if r.study == study)
        print(f"{study}: {sum(r.study == study for r in selected)} runs, {tot / 60:.0f} min")
    print(f"total: {len(selected)} runs, {sum(estimates[r.name] for r in selected) / 60:.0f} min at "
          f"{FLOPS_PER_S / 1e9:.0f} GFLOP/s")


def study_main(argv):
    """The study: lay out the grid, train (or resume, or skip) every selected run, then write the report."""
    args, pr = study_args(argv)
    out_root = args.out_dir or ("out/reproduce_quick" if args.quick else "out/reproduce")
    results = args.results or (os.path.join(out_root, "results") if args.quick else "studies/results")
    assets = args.assets or (os.path.join(out_root, "assets") if args.quick else "studies/results/reproduce")
    prefix = "reproduce_quick" if args.quick else "reproduce"
    runs = make_grid(pr)
    meta = load_meta(args.data_dir, pr.block_size, "byte")
    if meta["tokenizer"] != "byte":
        raise RunError(f"{args.data_dir} holds {meta['tokenizer']} tokens; the study is on byte tokens")
    estimates = {r.name: est_seconds(r, pr, meta["val_tokens"]) for r in runs}
    selected = [r for r in runs if not args.only or re.search(args.only, r.name)]
    if args.plan:
        print_plan(selected, estimates, pr)
        return None

    summary_dir = os.path.join(results, "reproduce")
    os.makedirs(summary_dir, exist_ok=True)
    console = sys.stdout
    progress = Progress(selected, {r.name: estimates[r.name] for r in selected}, console)
    summaries, t_start = {}, time.time()
    print(
        f"reproduce ({pr.name}): {len(selected)} runs, est. {progress.total / 60:.0f} min on 2 idle CPU "
        "cores; "
        f"data {args.data_dir}, checkpoints {out_root}, results {summary_dir}",
        flush=True,
    )
    stopped = False
    for r in runs:                       # the stored results of every run of the grid, --only or not
        path = os.path.join(summary_dir, f"{r.name}.json")
        s = load_summary(path, r)
        if s is not None and "data" in s and s["data"] != {k: meta[k] for k in s["data"]}:
            raise RunError(f"{path} was made on other data ({s['data']}, not {args.data_dir}'s); delete it to "
                           f"re-run, or pass another --results folder")
        if s is not None:
            summaries[r.name] = s
    for i, run in enumerate(selected):
        if run.name in summaries:
            progress.skip(run)
            print(f"[{i + 1}/{len(selected)}] {run.name}: done earlier, skipped", file=console, flush=True)
            continue
        _, elapsed, _ = progress.eta()
        if args.max_minutes is not None and elapsed + estimates[run.name] * (
                elapsed / progress.session_est if progress.session_est else 1.0) > 60 * args.max_minutes:
            print(
                f"--max_minutes {args.max_minutes}: stopping before {run.name}; run again to continue",
                flush=True,
            )
            stopped = True
            break
        out_dir = os.path.join(out_root, run.name)
        t0 = time.time()
        progress.start(i, run, out_dir)
        try:
            status = train_run(run, out_dir, args.data_dir, args.device)
            summary = summarize(run, out_dir, args.data_dir, pr) | {"commit": git_commit(), "device": args.device}
        except BaseException as e:
            progress.stop.set()
            if isinstance(e, KeyboardInterrupt):
                print(f"\ninterrupted: {run.name} continues from its last checkpoint next time", file=console)
            else:
                print(f"{run.name} failed; its log: {os.path.join(out_dir, 'train.log')}", file=console)
            raise
        summary["wall_s"] = round(time.time() - t0, 1)
        summary["status"] = status
        write_json(os.path.join(summary_dir, f"{run.name}.json"), summary)
        if os.path.exists(os.path.join(out_dir, "init.pt")):
            os.remove(os.path.join(out_dir, "init.pt"))
        summaries[run.name] = summary
        progress.end(i, run, summary, status)

    return write_report(pr, runs, summaries, meta, args.data_dir, results, assets, prefix,
                        stopped, t_start)


def write_report(pr, runs, summaries, meta, data_dir, results, assets, prefix, stopped, t_start):
    """Assemble the tables, claims and figures from the summaries of the finished runs; write
    RESULTS/reproduce.json and RESULTS/reproduce.md (--results); print the markdown. Returns the report."""
    tables, claims, resolution = assemble(pr, summaries)
    if pr.name.startswith("quick"):    # a few steps at toy size show that every path runs, never a result
        for claim in claims:
            claim["verdict"] = "smoke test only (--quick: toy size, a few steps; no verdict)"
    try:
        paths = figures(pr, summaries, tables, assets, prefix)
    except ImportError:
        paths = []
        print("figures skipped: pip install matplotlib", flush=True)
    data = {k: meta[k] for k in ("tokenizer", "train_tokens", "val_tokens", "sources") if k in meta}
    report = {
        "protocol": asdict(pr),
        "data": data | {"data_dir": data_dir},
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
        },
        "complete": len(summaries) == len(runs),
        "n_runs": len(runs),
        "n_done": len(summaries),
        "wall_s_runs": round(sum(s.get("wall_s", 0) for s in summaries.values()), 1),
        "wall_s_this_session": round(time.time() - t_start, 1),
        "resolution_bpb": resolution,
        "tables": tables,
        "claims": claims,
        "figures": paths,
        "runs": summaries,
    }
    write_json(os.path.join(results, "reproduce.json"), rounded(report))
    with open(os.path.join(results, "reproduce.md"), "w") as f:
        f.write(markdown(pr, tables, claims, resolution))
    print(markdown(pr, tables, claims, resolution), flush=True)
    print(f"wrote {os.path.join(results, 'reproduce.json')}, {os.path.join(results, 'reproduce.md')}"
          + "".join(f", {p}" for p in paths) + (" (partial: run again to continue)" if stopped or
                                                len(summaries) < len(runs) else ""), flush=True)
    return report


@keeps_process_state
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    if argv[:1] == ["starts"]:
        return starts_main(argv[1:])
    if argv[:1] == ["tolerance"]:
        return tolerance_main(argv[1:])
    if argv[:1] == ["gap"]:
        return gap_main(argv[1:])
    return study_main(argv)


if __name__ == "__main__":
    try:
        main()
    except (RunError, ConfigError) as e:
        sys.exit(f"error: {e}")
