"""
How many lines a reader must read to follow a script: the script itself, then every function and class of
the repository that it uses, and every one that those use, transitively (read with `ast`: a name used in a
definition's body is followed to where its module defines or imports it; a module-level table or constant
counts as a definition too; a class counts whole, a call on an object of unknown type, such as
model.forward, is not followed beyond the class). Blank lines count, as a reader sees them.

    python tools/reading_lines.py train.py sample.py
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_path(name):
    """The file of the repository module `name` ('support.data' -> support/data.py), or None if not ours."""
    path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def scope(path):
    """(tree, definitions {name: (first line, last line, node)}, imports {name: (module, name or None)}) of a
    module; its definitions: functions, classes, and names assigned at module level (tables, constants)."""
    tree = ast.parse(path.read_text())
    defs, imports = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            defs[node.name] = (first, node.end_lineno, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    if isinstance(name, ast.Name):                     # A = ..., and A, B = ...
                        defs[name.id] = (node.lineno, node.end_lineno, node)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports |= {a.asname or a.name: (node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            imports |= {a.asname or a.name: (a.name, None) for a in node.names}
    return tree, defs, imports


def used_names(node):
    """Names and `module.attr` pairs used inside `node`."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add((sub.id, None))
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            names.add((sub.value.id, sub.attr))
    return names


def reading_lines(script):
    """The lines a reader of `script` reads: {file: set of line numbers}."""
    seen, lines, todo = set(), {}, [(ROOT / script, None)]
    while todo:
        path, name = todo.pop()
        if (path, name) in seen:
            continue
        seen.add((path, name))
        tree, defs, imports = scope(path)
        if name is None:                                  # the whole script
            span, node = (1, len(path.read_text().splitlines())), tree
        else:
            *span, node = defs[name]
        lines.setdefault(path, set()).update(range(span[0], span[1] + 1))
        for ident, attr in used_names(node):
            if ident in defs and ident != name:
                todo.append((path, ident))
            elif ident in imports:
                module, imported = imports[ident]
                if imported is not None and module_path(module) and imported in scope(module_path(module))[1]:
                    todo.append((module_path(module), imported))
                elif imported is None and attr and module_path(module) and attr in scope(module_path(module))[1]:
                    todo.append((module_path(module), attr))
    return lines


if __name__ == "__main__":
    for script in sys.argv[1:] or ["train.py", "sample.py"]:
        lines = reading_lines(script)
        total = sum(len(v) for v in lines.values())
        files = ", ".join(f"{p.relative_to(ROOT)} {len(v)}" for p, v in sorted(lines.items()))
        print(f"{script}: {total} lines ({files})")
