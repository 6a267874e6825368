"""
The MeSH paper's Table 1 (§4.1) through lm-evaluation-harness, for one checkpoint or several side by side:
its nine tasks 0- and 5-shot, each with the paper's metric (plain accuracy for LAMBADA, WinoGrande and
continuation-MMLU; length-normalised acc_norm for HellaSwag, PIQA, ARC and SciQ), and the perplexities lm-eval
defines (Wikitext word perplexity, LAMBADA-OpenAI and -Standard perplexity of the target word), 0-shot.

    python -m studies.table1 out/vanilla_160m out/mesh_160m --batch_size 32 --out out/table1     # needs the network
    python -m studies.table1 hf:EleutherAI/pythia-160m --out out/table1_pythia160m              # needs the network
    python -m studies.table1 out/tiny_mesh --limit 50 --device cpu                               # a quick look

Writes OUT/table1.json (every score with lm-eval's standard error, the command, the versions) and
OUT/table1.md (one table per shot count, tasks as columns and the average last, accuracies in %; one table of
perplexities). Rerunning with the same OUT skips the (model, shots) runs already stored for the same checkpoint
and options, and evaluates a checkpoint trained since again (see run). The Pile perplexity of Table 1 is not
here: lm-eval has no Pile validation task whose data is still distributed.
Models are read by support.harness (train.py checkpoints or hf:<hub id or folder>; T²MLR in exact mode).
"""

import argparse
import itertools
import json
import os
import sys
import time

from support.process import keeps_process_state

# lm-eval task: (Table 1's column, the paper's metric), in the paper's order
TASKS = {
    "lambada_openai": ("LD-O", "acc"),
    "lambada_standard": ("LD-S", "acc"),
    "hellaswag": ("HellaSwag", "acc_norm"),
    "piqa": ("PIQA", "acc_norm"),
    "winogrande": ("WinoGrande", "acc"),
    "arc_easy": ("ARC-E", "acc_norm"),
    "arc_challenge": ("ARC-C", "acc_norm"),
    "sciq": ("SciQ", "acc_norm"),
    "mmlu_continuation": ("cMMLU", "acc"),
}
# lm-eval task: (column, metric), lower is better, from the 0-shot run
PERPLEXITIES = {
    "wikitext": ("Wiki (word)", "word_perplexity"),
    "lambada_openai": ("LD-O", "perplexity"),
    "lambada_standard": ("LD-S", "perplexity"),
}


def score(results: dict, task: str, metric: str):
    """(value, standard error or None) of `metric` for `task` (a task or a group, e.g. mmlu_continuation) in
    lm_eval's results dict. KeyError naming the task and metric when lm_eval did not report them."""
    row = {**results.get("groups", {}), **results["results"]}.get(task, {})
    if f"{metric},none" not in row:
        raise KeyError(f"lm_eval reported no {metric} for {task} (it has: {sorted(row) or 'nothing'})")
    stderr = row.get(f"{metric}_stderr,none")
    return row[f"{metric},none"], stderr if isinstance(stderr, (int, float)) else None


def evaluate(lm, shots: int, limit, task_manager, tasks, perplexities):
    """{"acc": {task: [value, stderr]}, "ppl": {task: [value, stderr]}} of one model at `shots` few-shot
    examples, for `tasks` and `perplexities` shaped as TASKS and PERPLEXITIES; perplexities only at 0 shots
    (a rolling perplexity has no few-shot form)."""
    import lm_eval
    perplexities = perplexities if shots == 0 else {}
    names = list(dict.fromkeys([*tasks, *perplexities]))
    results = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=shots, limit=limit,
                                      task_manager=task_manager, bootstrap_iters=1000)
    return {"acc": {t: score(results, t, metric) for t, (_, metric) in tasks.items()},
            "ppl": {t: score(results, t, metric) for t, (_, metric) in perplexities.items()}}


def run(models, out_dir, shots=(0, 5), limit=None, task_manager=None, tasks=None, perplexities=None,
        command="", include_path=None, batch_size=16, device="auto", dtype="auto", mode="exact", tol=0.0):
    """Evaluate every model (a checkpoint path, out_dir or hf:...) at every shot count, through
    support.harness.NanoLM(batch_size, device, dtype, mode, tol); store each run in out_dir/table1.json and
    rewrite table1.md as it finishes. Without accuracy tasks only the 0-shot run is made (a perplexity has
    no few-shot form). A rerun skips a stored run when the checkpoint is the one it evaluated (identity) and
    the options that change a score (limit, tasks, dtype, mode, tol, include_path and its files, the device
    type, the lm_eval version) are the same. A checkpoint trained further is evaluated again; other options:
    once the first new run has finished, the old file is kept as table1.json.old (or .old2, ...) and a new one
    begins. Returns the stored dict. Raises ValueError (a bad argument, or lm_eval's, with the model and shots
    named)."""
    import lm_eval
    from support.harness import NanoLM
    from support.runtime import resolve_device
    tasks = TASKS if tasks is None else tasks
    perplexities = PERPLEXITIES if perplexities is None else perplexities
    shots = scored_shots(shots, tasks, perplexities)
    path = os.path.join(out_dir, "table1.json")
    options = json.loads(json.dumps({"limit": limit, "tasks": tasks, "perplexities": perplexities, "dtype": dtype,
                                     "mode": mode, "tol": tol, "include_path": include_path,
                                     "include_files": include_path and folder_identity(include_path),
                                     "device_type": resolve_device(device).split(":")[0],
                                     "lm_eval": lm_eval.__version__}))
    stored = json.load(open(path)) if os.path.isfile(path) else {"options": options, "runs": {}}
    replaces_old = stored.get("options") != options
    if replaces_old:
        stored = {"options": options, "runs": {}}
    stored.update(command=command, lm_eval=lm_eval.__version__, models=list(models), shots=list(shots))
    for model in models:
        lm, checkpoint = None, identity(model)        # before the weights are read: a later change is seen
        for k in shots:
            key = f"{model} | {k}-shot"
            if key in stored["runs"]:
                if stored["runs"][key].get("checkpoint") == checkpoint:
                    print(f"{key}: stored, skipped", file=sys.stderr)
                    continue
                was = describe(stored["runs"][key].get("checkpoint"))
                print(f"{key}: {model} changed since it was evaluated ({was}; now {describe(checkpoint)}): "
                      f"evaluating it again", file=sys.stderr)
            lm = lm or NanoLM(checkpoint=model, batch_size=batch_size, device=device, dtype=dtype, mode=mode,
                              tol=tol)
            start = time.time()
            try:
                scores = evaluate(lm, k, limit, task_manager, tasks, perplexities)
            except ValueError as e:           # e.g. lm_eval: fewer examples than shots ("Sample larger ...")
                raise ValueError(f"{key}: {e}") from e
            stored["runs"][key] = {**scores, "seconds": round(time.time() - start, 1), **lm.get_model_info(),
                                   "checkpoint": checkpoint}
            if replaces_old and os.path.isfile(path):     # only now that a new run is there to take its place
                old = next(name for i in itertools.count(1)
                           if not os.path.exists(name := f"{path}.old{'' if i == 1 else i}"))
                os.replace(path, old)
                print(f"{path} was made with other options: kept as {old}, starting anew", file=sys.stderr)
            replaces_old = False
            write(stored, out_dir)
    if os.path.isfile(path):
        write(stored, out_dir)
    return stored


def scored_shots(shots, tasks, perplexities) -> list:
    """The shot counts that score something: all of `shots` when there are accuracy tasks, else only 0 (the
    perplexities' one). Raises ValueError when none is left."""
    if tasks:
        return list(shots)
    if 0 not in shots:
        raise ValueError(f"{', '.join(perplexities)}: perplexities are scored 0-shot only, and --shots "
                         f"{','.join(map(str, shots))} has no 0")
    if list(shots) != [0]:
        print("perplexities only: they are scored 0-shot, so only --shots 0 runs", file=sys.stderr)
    return [0]


def identity(model: str) -> dict:
    """What tells one state of `model` from another without reading its weights. A train.py checkpoint (ckpt.pt
    or its out_dir): its size, mtime (ns) and step (save_checkpoint writes a new file, so a checkpoint trained
    further differs in mtime). An hf: folder: folder_identity. An hf: hub id: the id (a released model's weights
    stay). {} for a file that is not there (NanoLM names it)."""
    if model.startswith("hf:"):
        return {"files": folder_identity(model[3:])} if os.path.isdir(model[3:]) else {"hub_id": model[3:]}
    path = os.path.join(model, "ckpt.pt") if os.path.isdir(model) else model
    if not os.path.isfile(path):
        return {}
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "step": recorded_step(path)}


def recorded_step(path):
    """The step the checkpoint at `path` records, read without loading its tensors (torch.load with mmap);
    None when it records none or cannot be read so (NanoLM reports a bad file)."""
    import torch
    try:
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step")
    except Exception:       # a damaged or foreign file: the evaluation's load names what is wrong
        return None
    return step if isinstance(step, int) else None


def folder_identity(folder) -> dict:
    """{path relative to folder: [size, mtime in ns]} of every file under `folder`: it changes when a file is
    edited, added or removed."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(root, name))
            files[os.path.relpath(os.path.join(root, name), folder)] = [stat.st_size, stat.st_mtime_ns]
    return dict(sorted(files.items()))


def describe(checkpoint) -> str:
    """An identity() in words, for the rerun notice: the step and when the file was written."""
    if not checkpoint or "mtime_ns" not in checkpoint:
        return "no checkpoint recorded" if not checkpoint else "other files"
    written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(checkpoint["mtime_ns"] / 1e9))
    return f"step {checkpoint['step']}, written {written}"


def write(stored, out_dir):
    """table1.json and table1.md in out_dir, each atomically (a temporary file renamed over it)."""
    os.makedirs(out_dir, exist_ok=True)
    for name, text in (("table1.json", json.dumps(stored, indent=1)), ("table1.md", markdown(stored))):
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def markdown(stored) -> str:
    """Table 1's layout for the tasks `stored` was run on: per shot count a table of models x tasks (accuracy
    in %, the metric under each column name) with the average of the tasks last; then the perplexities
    (0-shot). A run not yet done is "–"."""
    tasks, perplexities, limit = (stored["options"][key] for key in ("tasks", "perplexities", "limit"))
    lines = [f"lm-evaluation-harness {stored['lm_eval']}" + (f", first {limit} examples per task" if limit else "")
             + f". `{stored['command']}`" * bool(stored["command"]), ""]

    def row(model, run, kind, names, scale):
        if run is None:
            return f"| {model} | " + " | ".join("–" for _ in names) + " |" + " – |" * (kind == "acc")
        values = [scale * run[kind][t][0] for t in names]
        average = f" {sum(values) / len(values):.2f} |" if kind == "acc" else ""
        return f"| {model} | " + " | ".join(f"{v:.2f}" for v in values) + " |" + average

    for k in stored["shots"] if tasks else []:       # perplexities only: no accuracy table
        lines += [f"**{k}-shot** (%)", "",
                  "| model | " + " | ".join(f"{col} ({metric})" for col, metric in tasks.values()) + " | Avg. |",
                  "|---" * (len(tasks) + 2) + "|"]
        lines += [row(m, stored["runs"].get(f"{m} | {k}-shot"), "acc", tasks, 100) for m in stored["models"]] + [""]
    if 0 in stored["shots"] and perplexities:
        lines += ["**Perplexity** (0-shot, lower is better)", "",
                  "| model | " + " | ".join(col for col, _ in perplexities.values()) + " |",
                  "|---" * (len(perplexities) + 1) + "|"]
        lines += [row(m, stored["runs"].get(f"{m} | 0-shot"), "ppl", perplexities, 1) for m in stored["models"]]
        lines.append("")
    return "\n".join(lines)


@keeps_process_state
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("models", nargs="+", help="train.py checkpoints (ckpt.pt or its out_dir) or hf:<hub id or folder>")
    parser.add_argument("--out", default="out/table1", help="folder for table1.json and table1.md")
    parser.add_argument("--shots", default="0,5", help="few-shot counts, comma-separated (default 0,5)")
    parser.add_argument("--tasks", default=None, help="a comma-separated subset of the suite's lm-eval tasks "
                        f"(default all: {', '.join(dict.fromkeys([*TASKS, *PERPLEXITIES]))})")
    parser.add_argument("--limit", type=int, default=None, help="first N examples per task (a quick look)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16 or float64")
    parser.add_argument("--mode", default="exact", help="T²MLR: exact (the model), jacobi or converged")
    parser.add_argument("--tol", type=float, default=0.0, help="T²MLR, mode converged: its tolerance")
    parser.add_argument("--include_path", default=None,
                        help="a folder of lm-eval task YAMLs read before the built-in ones: a task of the\n"
                             "same name (e.g. a local copy of hellaswag) replaces the built-in one")
    args = parser.parse_args(argv)
    try:
        shots = tuple(int(s) for s in args.shots.split(","))
    except ValueError:
        parser.error(f"--shots {args.shots!r} is not a comma-separated list of integers")
    if any(s < 0 for s in shots) or args.limit is not None and args.limit < 1 or args.batch_size < 1:
        parser.error("--shots must be >= 0, --limit and --batch_size >= 1")
    tasks, perplexities = TASKS, PERPLEXITIES
    if args.tasks:
        chosen = args.tasks.split(",")
        unknown = [t for t in chosen if t not in TASKS and t not in PERPLEXITIES]
        if unknown:
            parser.error(f"--tasks: {', '.join(unknown)} not in the suite; choose from "
                         f"{', '.join(dict.fromkeys([*TASKS, *PERPLEXITIES]))}")
        tasks = {t: v for t, v in TASKS.items() if t in chosen}
        perplexities = {t: v for t, v in PERPLEXITIES.items() if t in chosen}
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=args.include_path) if args.include_path else None
    stored = run(args.models, args.out, shots, args.limit, manager, tasks, perplexities,
                 command="python -m studies.table1 " + " ".join(argv if argv is not None else sys.argv[1:]),
                 include_path=args.include_path, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                 mode=args.mode, tol=args.tol)
    print(markdown(stored))
    print(f"wrote {os.path.join(args.out, 'table1.json')} and table1.md", file=sys.stderr)


if __name__ == "__main__":
    from support.harness import exit_on_error, offline_when_unreachable
    offline_when_unreachable()
    exit_on_error(main)
