"""
The requirements files name every library the code imports (a second or less): `pip install -r
requirements.txt && python -m pytest -q` needs nothing else, and the evaluation code (support/harness.py,
studies/table1.py and their tests) nothing beyond requirements-eval.txt and what it installs.

    python -m pytest -q tests/test_requirements.py
"""

import ast
import importlib
import os
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
EVALUATION = {"support/harness.py", "studies/table1.py", "tests/test_harness.py", "tests/test_pretrained.py",
              "studies/tests/test_evaluation.py", "studies/tests/test_table1.py"}


def imported_modules(path):
    """The top-level names of every absolute import in the Python file at `path`, in functions too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def requirements(name):
    """The canonical distribution names in the requirements file ROOT/name."""
    lines = (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return {canonicalize_name(Requirement(line).name) for line in lines if line}


def installs(distributions):
    """`distributions` and the distributions they require (what pip installs for them), where installed."""
    found = set(distributions)
    for dist in distributions:
        try:
            found |= {canonicalize_name(Requirement(r).name) for r in importlib.metadata.requires(dist) or []
                      if "extra ==" not in r}
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def third_party_imports():
    """{module: {files importing it}} of the repository's Python files, without the standard library and the
    repository's own modules."""
    own = {p.stem for p in ROOT.glob("*.py")} | {p.stem for p in (ROOT / "tests").glob("*.py")} | {
        p.name for p in ROOT.iterdir() if p.is_dir()}
    found = {}
    for path in sorted(ROOT.glob("*.py")) + sorted(ROOT.glob("[!.]*/**/*.py")):
        for module in imported_modules(path) - own - set(sys.stdlib_module_names):
            found.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_library_is_in_a_requirements_file():
    base = requirements("requirements.txt")
    evaluation = installs(base | requirements("requirements-eval.txt"))
    base_installs = installs(base)                # e.g. packaging, which pytest requires
    provided = importlib.metadata.packages_distributions()
    missing = []
    for module, files in sorted(third_party_imports().items()):
        dists = {canonicalize_name(d) for d in provided.get(module, [module])}
        allowed = evaluation if files <= EVALUATION else base_installs
        if not dists & allowed:
            missing.append(f"{module} (imported by {', '.join(sorted(files - EVALUATION) or files)})")
    assert missing == []
    assert "matplotlib" in third_party_imports() and "matplotlib" in base      # the studies' figures


@pytest.mark.slow
def test_the_evaluation_libraries_are_installed_where_ci_requires_them():
    """With NANOMESH_REQUIRE_LM_EVAL=1 (CI's second tier) the optional tests must run, not skip: their
    libraries import."""
    if os.environ.get("NANOMESH_REQUIRE_LM_EVAL") != "1":
        pytest.skip("only where NANOMESH_REQUIRE_LM_EVAL=1 (CI)")
    for module in ("lm_eval", "datasets", "transformers", "accelerate"):
        importlib.import_module(module)
