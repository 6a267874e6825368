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
perplexities). Rerunning with the same OUT skips the (model, shots) runs already stored (see run). The
Pile perplexity of Table 1 is not here: lm-eval has no Pile validation task whose data is still distributed.
Models are read by support.harness (train.py checkpoints or hf:<hub id or folder>; T²MLR in exact mode).
"""

import argparse
import json
import os
import sys
import time

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


def evaluate(lm, shots: int, limit=None, task_manager=None, tasks=None, perplexities=None):
    """{"acc": {task: [value, stderr]}, "ppl": {task: [value, stderr]}} of one model at `shots` few-shot
    examples; perplexities only at 0 shots (a rolling perplexity has no few-shot form)."""
    import lm_eval
    tasks = TASKS if tasks is None else tasks
    perplexities = (PERPLEXITIES if perplexities is None else perplexities) if shots == 0 else {}
    names = list(dict.fromkeys([*tasks, *perplexities]))
    results = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=shots, limit=limit,
                                      task_manager=task_manager, bootstrap_iters=1000)
    return {"acc": {t: score(results, t, metric) for t, (_, metric) in tasks.items()},
            "ppl": {t: score(results, t, metric) for t, (_, metric) in perplexities.items()}}


def run(models, out_dir, shots=(0, 5), limit=None, task_manager=None, tasks=None, perplexities=None,
        command="", include_path=None, batch_size=16, device="auto", dtype="auto", mode="exact"):
    """Evaluate every model (a checkpoint path, out_dir or hf:...) at every shot count, through
    support.harness.NanoLM(batch_size, device, dtype, mode); store each run in out_dir/table1.json as it
    finishes and write the tables. A rerun skips the stored runs when the options that change a score (limit,
    tasks, dtype, mode, include_path) are the same; otherwise the old file is kept as table1.json.old and a
    new one begins. Returns the stored dict."""
    import lm_eval
    from support.harness import NanoLM
    tasks = TASKS if tasks is None else tasks
    perplexities = PERPLEXITIES if perplexities is None else perplexities
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "table1.json")
    options = json.loads(json.dumps({"limit": limit, "tasks": tasks, "perplexities": perplexities, "dtype": dtype,
                                     "mode": mode, "include_path": include_path}))
    stored = json.load(open(path)) if os.path.isfile(path) else {"options": options, "runs": {}}
    if stored.get("options") != options:
        os.replace(path, path + ".old")
        print(f"{path} was made with other options: kept as {path}.old, starting anew", file=sys.stderr)
        stored = {"options": options, "runs": {}}
    stored.update(command=command, lm_eval=lm_eval.__version__, models=list(models), shots=list(shots))
    for model in models:
        lm = None
        for k in shots:
            key = f"{model} | {k}-shot"
            if key in stored["runs"]:
                print(f"{key}: stored, skipped", file=sys.stderr)
                continue
            lm = lm or NanoLM(checkpoint=model, batch_size=batch_size, device=device, dtype=dtype, mode=mode)
            start = time.time()
            stored["runs"][key] = {**evaluate(lm, k, limit, task_manager, tasks, perplexities),
                                   "seconds": round(time.time() - start, 1), **lm.get_model_info()}
            with open(path + ".tmp", "w") as f:
                json.dump(stored, f, indent=1)
            os.replace(path + ".tmp", path)
    with open(os.path.join(out_dir, "table1.md"), "w") as f:
        f.write(markdown(stored, tasks, perplexities))
    return stored


def markdown(stored, tasks=None, perplexities=None) -> str:
    """Table 1's layout: per shot count a table of models x tasks (accuracy in %, the metric under each column
    name) with the average of the tasks last; then the perplexities (0-shot)."""
    tasks = TASKS if tasks is None else tasks
    perplexities = PERPLEXITIES if perplexities is None else perplexities
    limit = stored["options"]["limit"]
    lines = [f"lm-evaluation-harness {stored['lm_eval']}" + (f", first {limit} examples per task" if limit else "")
             + f". `{stored['command']}`" * bool(stored["command"]), ""]
    for k in stored["shots"]:
        lines += [f"**{k}-shot** (%)", "",
                  "| model | " + " | ".join(f"{col} ({metric})" for col, metric in tasks.values()) + " | Avg. |",
                  "|---" * (len(tasks) + 2) + "|"]
        for model in stored["models"]:
            acc = stored["runs"][f"{model} | {k}-shot"]["acc"]
            values = [100 * acc[t][0] for t in tasks]
            lines.append(f"| {model} | " + " | ".join(f"{v:.2f}" for v in values) +
                         f" | {sum(values) / len(values):.2f} |")
        lines.append("")
    if 0 in stored["shots"] and perplexities:
        lines += ["**Perplexity** (0-shot, lower is better)", "",
                  "| model | " + " | ".join(col for col, _ in perplexities.values()) + " |",
                  "|---" * (len(perplexities) + 1) + "|"]
        for model in stored["models"]:
            ppl = stored["runs"][f"{model} | 0-shot"]["ppl"]
            lines.append(f"| {model} | " + " | ".join(f"{ppl[t][0]:.2f}" for t in perplexities) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("models", nargs="+", help="train.py checkpoints (ckpt.pt or its out_dir) or hf:<hub id or folder>")
    parser.add_argument("--out", default="out/table1", help="folder for table1.json and table1.md")
    parser.add_argument("--shots", default="0,5", help="few-shot counts, comma-separated (default 0,5)")
    parser.add_argument("--limit", type=int, default=None, help="first N examples per task (a quick look)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float64")
    parser.add_argument("--mode", default="exact", help="T²MLR: exact (the model), jacobi or converged")
    parser.add_argument("--include_path", default=None, help="a folder of extra lm-eval task YAMLs")
    args = parser.parse_args(argv)
    try:
        shots = tuple(int(s) for s in args.shots.split(","))
    except ValueError:
        parser.error(f"--shots {args.shots!r} is not a comma-separated list of integers")
    if any(s < 0 for s in shots) or args.limit is not None and args.limit < 1 or args.batch_size < 1:
        parser.error("--shots must be >= 0, --limit and --batch_size >= 1")
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=args.include_path) if args.include_path else None
    stored = run(args.models, args.out, shots, args.limit, manager, command="python -m studies.table1 " +
                 " ".join(argv if argv is not None else sys.argv[1:]), include_path=args.include_path,
                 batch_size=args.batch_size, device=args.device, dtype=args.dtype, mode=args.mode)
    print(markdown(stored))
    print(f"wrote {os.path.join(args.out, 'table1.json')} and table1.md", file=sys.stderr)


if __name__ == "__main__":
    from configurator import ConfigError
    from prepare_data import DataError
    from support.runtime import RunError
    try:
        main()
    except (RunError, ValueError, KeyError, ConfigError, DataError) as e:
        sys.exit(f"error: {e}")
