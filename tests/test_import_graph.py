"""The import graph of kiln/: no cycle of more than 3 files where the rooms are untangled.

The graph is read with ``ast`` from every ``import`` in every file, function-local ones
included (a lazy import still ties the two files together). A package's ``__init__``
importing its submodules is an edge like any other; a submodule's implicit import of its
parent package is not (Python runs it, but it is not a dependency the file chose).
"""
import ast
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kiln")
MAX_CYCLE = 3
CHECKED = ("kiln.kernels", "kiln.autograd", "kiln.ops", "kiln.capture")   # rooms that must stay untangled


def _modules():
    mods = {}
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join(rel)] = path
    return mods


def _resolve(name, mods):
    """The module a dotted name refers to (a name inside a module is the module)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph():
    """{module: set of kiln modules it imports}, from every import statement."""
    mods = _modules()
    graph = {}
    for mod, path in mods.items():
        with open(path) as fh:
            tree = ast.parse(fh.read(), path)
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                names = [f"{stem}.{a.name}" for a in node.names] + [stem]
                # "from pkg import name": the submodule when it is one, else pkg itself
                names = [n for n in names[:-1] if n in mods] or [stem]
            else:
                continue
            for n in names:
                target = _resolve(n, mods)
                if target and target != mod:
                    out.add(target)
        graph[mod] = out
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm, iterative; components of more than one module."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return sorted(comps, key=len, reverse=True)


def _touches(comp, prefixes):
    return any(m == p or m.startswith(p + ".") for m in comp for p in prefixes)


def test_no_large_import_cycle_in_untangled_rooms():
    comps = strongly_connected(import_graph())
    for comp in comps:                      # the rest of kiln/, for the record (-s shows it)
        print(f"cycle of {len(comp)}: {', '.join(comp)}", file=sys.stderr)
    bad = [c for c in comps if len(c) > MAX_CYCLE and _touches(c, CHECKED)]
    assert not bad, bad


def test_no_large_import_cycle_anywhere():
    assert all(len(c) <= MAX_CYCLE for c in strongly_connected(import_graph()))


def test_the_checker_sees_function_local_imports(tmp_path):
    """A cycle made only by an import inside a function is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    src = "def f():\n    from . import b\n"
    tree = ast.parse(src)
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))


def test_no_file_in_kernels_over_1000_lines():
    for d, _, files in os.walk(os.path.join(ROOT, "kernels")):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f)) as fh:
                    assert sum(1 for _ in fh) <= 1000, os.path.join(d, f)
