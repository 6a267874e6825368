"""
The house's layers, read from the imports with `ast`: model.py imports torch and the standard library only;
a support/ module imports model.py, other support modules and third-party packages, never a script
(train.py, sample.py, prepare_data.py, bench.py, configurator.py, test_equivalence.py) or a study; and no
import circle exists at module level (imports inside functions are left out: they run when called).

    python tests/test_imports.py        # prints the graph of the repository's own modules
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"train", "sample", "prepare_data", "bench", "configurator", "test_equivalence"}


def own_modules():
    """{dotted name: path} of the repository's Python modules (tests excluded)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "out", "data", "config", "assets") or rel.parts[0].startswith("."):
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def module_level_imports(path, name, modules):
    """The modules (own or not) that `path` imports at module level, relative imports resolved."""
    tree, out = ast.parse(path.read_text()), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in tree.body:          # module level only, `if` and `try` blocks included, `__main__` left out
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.Import):
                out |= {a.name for a in sub.names}
            elif isinstance(sub, ast.ImportFrom):
                base = sub.module or ""
                if sub.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - sub.level + 1] + ([base] if base else []))
                out.add(base)
                out |= {f"{base}.{a.name}" for a in sub.names if f"{base}.{a.name}" in modules}
    return out


def graph():
    """{own module: the own modules it imports at module level}, and {module: every top-level package}."""
    modules = own_modules()
    edges, packages = {}, {}
    for name, path in modules.items():
        imported = module_level_imports(path, name, modules)
        edges[name] = sorted(m for m in imported if m in modules and m != name)
        packages[name] = sorted({m.split(".")[0] for m in imported})
    return edges, packages


def cycles(edges):
    """Every import circle, as the list of modules around it (depth-first search)."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in edges:
        if node not in state:
            visit(node)
    return found


def test_model_py_imports_torch_and_the_standard_library_only():
    _, packages = graph()
    foreign = [p for p in packages["model"] if p != "torch" and p not in sys.stdlib_module_names]
    assert foreign == [], foreign


def test_support_modules_import_no_script_and_no_study():
    edges, _ = graph()
    wrong = {m: [i for i in imps if i.split(".")[0] in SCRIPTS | {"studies"}]
             for m, imps in edges.items() if m.startswith("support")}
    assert {m: w for m, w in wrong.items() if w} == {}


def every_import(path):
    """The top-level names of every absolute import in the file at `path`, inside functions too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_support_imports_no_script_even_inside_a_function():
    wrong = {str(p.relative_to(ROOT)): sorted(every_import(p) & (SCRIPTS | {"studies"}))
             for p in sorted((ROOT / "support").glob("*.py"))}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_nothing_outside_studies_imports_a_study():
    """The top level stands apart from the lab: the scripts, support/ and tests/ never import studies/."""
    files = sorted(ROOT.glob("*.py")) + sorted((ROOT / "support").glob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    wrong = [str(p.relative_to(ROOT)) for p in files if "studies" in every_import(p)]
    assert wrong == []


def test_no_import_circle_at_module_level():
    edges, _ = graph()
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c", "a"]]
    assert cycles({"a": ["b"], "b": []}) == []


if __name__ == "__main__":
    edges, _ = graph()
    for name in sorted(edges):
        print(f"{name:28s} -> {', '.join(edges[name]) or '(nothing of ours)'}")
    print(f"circles: {cycles(edges) or 'none'}")
