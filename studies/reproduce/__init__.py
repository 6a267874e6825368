"""
Reproduce both papers' findings at laptop scale, with paired seeds and 95% confidence intervals.

    python prepare_data.py --input path/to/fineweb_edu/*.jsonl --tokenizer byte --name fineweb_byte
    python -m studies.reproduce --plan       # the grid, with the estimated minutes of every run; runs nothing
    python -m studies.reproduce              # the whole study (2.1 h measured on 2 CPU cores); resumable
    python -m studies.reproduce --max_minutes 60   # run for at most an hour, then assemble what is done
    python -m studies.reproduce --quick      # every path end to end at toy size, in under 2 minutes (CI)
    python -m studies.reproduce plot out/tiny_base out/tiny_mesh --out curves.png   # any train.py runs
    python -m studies.reproduce starts out/reproduce/t2mlr_t2mlr_s*/ckpt.pt   # Jacobi gap, zero/ungated starts
    python -m studies.reproduce tolerance --fixed DIR ... --tol DIR ...       # fixed D against jacobi_tol

Everything is trained by train.py (`train.main(argv)`, in this process) and probed with studies/probe.py;
this package only lays out the grid, pairs the seeds, collects the numbers and draws them. Results go to
studies/results/ (reproduce/<run>.json per finished run, reproduce.json, reproduce.md), figures to studies/results/reproduce/.

The parts, each readable on its own, in the order a run passes through them:

    protocol.py   the study's design: Protocol (FULL, QUICK), the arms and their model configs, the grid of
                  runs (make_grid), the paired initial weights and the router-initialisation arm
    runs.py       launching train.py for one run, resuming it, reading its log, storing its summary JSON
                  (resume across sessions), the time estimates and the grid's progress
    summary.py    one finished run's numbers: curves, final val loss, the MeSH §4 probes, the Jacobi gap
    stats.py      paired differences, Student-t 95% intervals (scipy.stats) and verdicts
    tables.py     every arm against its baseline, the papers' claims with verdicts, the markdown report
    figures.py    the figures, and the `plot` subcommand
    jacobi.py     the `starts` and `tolerance` subcommands (Jacobi side studies of T²MLR)
    __main__.py   the command line
"""
