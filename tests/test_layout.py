"""
The shape of the repository, as the design card asks: a nanoGPT-sized top level, a model.py that is the
model with the two ideas at its centre, a README that tells the story and links the details.

    python tests/test_layout.py        # prints the numbers these tests check
"""

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# the two ideas: MeSH's memory and recursion, the papers' inits (MeSH §4.1, T²MLR's gate), T²MLR's gate, state
# update and both ways to run the recurrence
IDEAS = ("GPT.recursive_forward", "GPT.mesh_write_read", "GPT.init_weights", "GPT.temporal_gate",
         "GPT.state_update", "GPT.jacobi_forward", "GPT.exact_forward")


def code_lines(source: str):
    """(the set of code lines of `source`: lines with a token that is not a comment, outside docstrings;
    {definition name: its line range}) for top-level classes, their methods and top-level functions."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                docstrings |= set(range(first.lineno, first.end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines |= set(range(tok.start[0], tok.end[0] + 1))
    spans = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            spans[node.name] = range(node.lineno - len(node.decorator_list), node.end_lineno + 1)
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    spans[f"{node.name}.{f.name}"] = range(f.lineno - len(f.decorator_list), f.end_lineno + 1)
    return lines - docstrings, spans


def model_numbers():
    source = (ROOT / "model.py").read_text()
    lines, spans = code_lines(source)
    ideas = {n for name in IDEAS for n in spans[name]} & lines
    return {"lines": len(source.splitlines()), "code": len(lines), "ideas": len(ideas),
            "ideas_share": len(ideas) / len(lines),
            "long_lines": [n for n, line in enumerate(source.splitlines(), 1) if len(line) > 100]}


def test_code_lines_counts_code_not_comments_or_docstrings():
    source = 'def f():\n    """doc\n    string"""\n    # a comment\n    x = 1  # trailing\n\n    return x\n'
    lines, spans = code_lines(source)
    assert lines == {1, 5, 7} and list(spans["f"]) == list(range(1, 8))


def test_model_py_is_the_model_with_the_ideas_at_its_centre():
    numbers = model_numbers()
    assert numbers["lines"] <= 600, numbers
    assert numbers["ideas_share"] >= 0.33, numbers      # the rest: layers, config, checks, generation


def test_no_model_py_line_is_over_100_characters():
    assert model_numbers()["long_lines"] == [], "model.py lines (numbers) over 100 characters"


T2MLR = {"t2mlr": True, "l_start": 1, "l_end": 2}
PATHS = {            # a path -> (its config's fields, how it runs): the README's reading map
    "vanilla": ({}, lambda m, idx, cache: m(idx)),
    "base": ({"layout": "1+2R2+1"}, lambda m, idx, cache: m(idx)),
    "mesh": ({"layout": "1+2R2+1", "state_passing": "mesh"}, lambda m, idx, cache: m(idx)),
    "jacobi": (T2MLR | {"jacobi_sweeps": 4}, lambda m, idx, cache: m.train()(idx)),
    "exact": (T2MLR, lambda m, idx, cache: m(idx, mode="exact")),
    "cached generation": ({}, lambda m, idx, cache: m.generate(idx, 3)),
    "cached T²MLR generation": (T2MLR, lambda m, idx, cache: m.generate(idx, 3)),
    "T²MLR decoding": (T2MLR, lambda m, idx, cache: [m(idx[:, t:t + 1], cache=cache) for t in range(6)]),
}


def follow(path, build=False):
    """Run `path` on a tiny model, profiling model.py's frames -> (nesting: the deepest chain of model.py calls
    below the first one entered (GPT.forward or GPT.generate), each nn.Module call once, torch's own frames,
    lambdas and comprehensions not at all; entered: the qualified names of the model.py functions entered,
    the first left out, functions nested inside one part of it). build: entered also holds the first and the
    functions that building the model enters (GPTConfig's and GPT's constructors)."""
    from model import GPT, GPTConfig, InferenceCache
    fields, run = PATHS[path]
    source, depth, deepest, entered = str(ROOT / "model.py"), [0], [0], []

    def profile(frame, event, arg):
        code = frame.f_code
        if code.co_filename == source and "<" not in code.co_qualname:
            depth[0] += {"call": 1, "return": -1}.get(event, 0)
            deepest[0] = max(deepest[0], depth[0])
            if event == "call":
                entered.append(code.co_qualname)
    sys.setprofile(profile)
    try:
        model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=16, **fields)).eval()
    finally:
        sys.setprofile(None)
    idx, cache = torch.randint(0, 64, (1, 6)), InferenceCache(model.cfg.n_unrolled)
    built, depth[0], deepest[0] = entered.copy(), 0, 0      # building's calls apart from the run's
    entered.clear()
    sys.setprofile(profile)
    try:
        with torch.no_grad() if path != "jacobi" else torch.enable_grad():
            run(model, idx, cache)
    finally:
        sys.setprofile(None)
    return deepest[0] - 1, (set(entered) | set(built)) if build else set(entered) - {entered[0]}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_nests_three_calls_below_forward(path):
    """Calls below the first model.py function entered, down to a layer: GPT.forward -> jacobi_forward ->
    run_layers -> Layer is 3, vanilla's forward 2, vanilla's generate -> forward -> .. 3; T²MLR's generate
    adds forward's one to exact_forward's 3."""
    nesting = follow(path)[0]
    assert nesting == {"vanilla": 2, "cached T²MLR generation": 4}.get(path, 3), nesting


def jumps(path, build=False) -> list:
    """The definitions a reader opens following `path` from its first function to the logits, by the rule
    nanoGPT takes 10 and 11 under: every definition outside the function being read, GPTConfig (its fields
    and methods) and each class's __init__ included, each once a path. build: a cold reader's count, the
    function read first and every function that building the model enters (GPTConfig.__post_init__, the
    checks, the inits) counted too."""
    opened = {"GPTConfig" if name.startswith("GPTConfig.") and not build else name
              for name in follow(path, build)[1]}
    classes = {name.split(".")[0] for name in opened if "." in name} - {"GPT", "GPTConfig"}   # fields: "GPTConfig"
    return sorted(opened | {"GPTConfig", "GPT.__init__"} | {f"{c}.__init__" for c in classes})


JUMP_TARGETS = {"vanilla": 5, "base": 6, "mesh": 7, "jacobi": 8, "exact": 8, "cached generation": 8,
                "cached T²MLR generation": 11}
# the same paths counted as a cold reader counts: the first function and building the model too, GPTConfig's
# fields one definition; T²MLR's Jacobi and exact paths at most 12, as nanoGPT's vanilla path
BUILD_TARGETS = {"vanilla": 9, "base": 10, "mesh": 11, "jacobi": 12, "exact": 12, "cached generation": 11,
                 "cached T²MLR generation": 14}


@pytest.mark.parametrize("path", list(JUMP_TARGETS))
def test_every_path_opens_at_most_its_target_of_definitions(path):
    opened = jumps(path)
    assert len(opened) <= JUMP_TARGETS[path], opened
    opened = jumps(path, build=True)
    assert len(opened) <= BUILD_TARGETS[path], opened


def top_level_py():
    """The top-level .py files git tracks (a user's scratch script in the checkout is not the repository's),
    or every top-level .py where there is no git."""
    try:
        tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
        return sorted(name for name in tracked if "/" not in name)
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.name for p in ROOT.glob("*.py"))


def test_top_level_is_nanogpt_sized():
    top = top_level_py()
    assert len(top) <= 7, top
    for name in ("model.py", "train.py", "sample.py", "prepare_data.py", "test_equivalence.py"):
        assert name in top


def test_readme_is_short_and_every_local_link_resolves():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "studies").glob("*.md"))]:
        prose = re.sub(r"```.*?```|`[^`]*`", "", page.read_text(), flags=re.S)     # code is not a link
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_ci_runs_the_readme_quick_start_as_written():
    """.ci/run runs the lines .ci/quickstart.py reads from the README: its install and both test tiers."""
    lines = subprocess.run([sys.executable, str(ROOT / ".ci" / "quickstart.py")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert lines == ["pip install -r requirements.txt", "python -m pytest -q",
                     "pip install -r requirements-eval.txt", "python -m pytest -q -m slow"]
    readme = (ROOT / "README.md").read_text()
    assert "\npip install torch --index-url https://download.pytorch.org/whl/cpu" in readme   # its own line
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python .ci/quickstart.py > /tmp/quickstart.sh" in ci and "bash -euxo pipefail /tmp/quickstart.sh" in ci
    assert "pip install -r" not in ci and "pytest" not in ci.replace("quickstart", "")   # nothing CI adds


def test_two_test_tiers_and_pytest_finds_every_test():
    """`python -m pytest -q` leaves the slow tier out; -m slow runs it; pytest.ini finds tests/, studies/ and
    test_equivalence.py; every test under studies/ is in the slow tier (studies/tests/conftest.py)."""
    import configparser
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    assert ini["pytest"]["addopts"].strip() == '-m "not slow"'
    assert set(ini["pytest"]["testpaths"].split()) == {"test_equivalence.py", "tests", "studies"}
    conftest = (ROOT / "studies" / "tests" / "conftest.py").read_text()
    assert "add_marker(pytest.mark.slow)" in conftest
    found = {p.relative_to(ROOT).parts[0] for p in ROOT.rglob("test_*.py") if ".git" not in p.parts
             and "out" not in p.relative_to(ROOT).parts[:1]}
    assert found <= {"test_equivalence.py", "tests", "studies"}, found


def test_the_readme_states_the_lines_a_reader_reads_to_follow_each_script():
    from tools.reading_lines import reading_lines
    readme = (ROOT / "README.md").read_text()
    for script in ("train.py", "sample.py"):
        total = sum(len(v) for v in reading_lines(script).values())
        assert f"{total:,} lines" in readme or f"{total:,} for {script}" in readme, (script, total)


def test_reading_lines_counts_the_tables_a_function_reads():
    """A module-level table that a followed function reads is read too: support/runtime.py's PEAK_FLOPS (read
    by peak_flops, which train.py's log uses), every line of it, and not a table no followed code names."""
    import ast
    from tools.reading_lines import reading_lines
    path = ROOT / "support" / "runtime.py"
    table = next(node for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "PEAK_FLOPS")
    read = reading_lines("train.py")[path]
    assert set(range(table.lineno, table.end_lineno + 1)) <= read and table.end_lineno - table.lineno >= 3
    sample_read = reading_lines("sample.py").get(path, set())
    assert not set(range(table.lineno, table.end_lineno + 1)) & sample_read      # sample.py reports no MFU


def test_train_py_reads_like_nanogpt_within_its_budgets():
    """train.py within 450 lines, its main (the loop on the page) and every other function within 60; the lines
    a reader follows from it (tools/reading_lines.py) within budget, outside model.py too; prepare_data.py
    within 350 lines."""
    from tools.reading_lines import reading_lines
    source = (ROOT / "train.py").read_text()
    spans = {name: span for name, span in code_lines(source)[1].items() if "." not in name}
    longest = max(spans, key=lambda name: len(spans[name]))
    assert len(source.splitlines()) <= 450
    assert len(spans["main"]) <= 60 and len(spans[longest]) <= 60, (longest, len(spans[longest]))
    lines = reading_lines("train.py")
    total = sum(len(v) for v in lines.values())
    outside_model = total - len(lines.get(ROOT / "model.py", ()))
    assert total <= 2235 and outside_model <= 1685, (total, outside_model)     # module-level tables counted
    assert len((ROOT / "prepare_data.py").read_text().splitlines()) <= 350


def test_no_message_doc_or_default_points_at_a_folder_users_lack():
    """Users have no shared/ folder beside the checkout: no code, doc or config names one."""
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if (path.suffix not in (".py", ".md", ".txt", ".ini") or rel.parts[0] in (".git", "out", "data")
                or rel.parts[:2] == ("studies", "results") or path.name == "test_layout.py"):
            continue
        if re.search(r"\.\./shared\b|\bshared/(data|tiktoken)", path.read_text(errors="ignore")):
            found.append(str(rel))
    assert found == []


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    numbers = model_numbers()
    print(f"model.py: {numbers['lines']} lines, {numbers['code']} code lines, the ideas {numbers['ideas']} "
          f"= {100 * numbers['ideas_share']:.1f}%, {len(numbers['long_lines'])} lines over 100 characters")
    print(f"README.md: {len((ROOT / 'README.md').read_text().splitlines())} lines")
    for path in JUMP_TARGETS:
        opened, cold = jumps(path), jumps(path, build=True)
        print(f"{path}: {len(opened)} jumps: {', '.join(opened)}; building it too: {len(cold)}, adds "
              f"{', '.join(sorted(set(cold) - set(opened)))}")
    print(f"top-level .py: {', '.join(top_level_py())}")
