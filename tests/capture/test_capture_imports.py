"""kiln/capture is a one-way stack (DESIGN.md): the import graph between its files,
function-local imports included, has no cycle (issue 22 asked for none larger than 3
files). This test measures the largest strongly connected component and keeps it from
growing. Rule modules reach one another through registries (``values.rules``,
``values.kinds``, ``rule_tables``) filled on import; ``rule_modules`` imports them all,
and a test here checks that it lists every module that registers something.

Run as a script to print every component larger than one file:
``PYTHONPATH=. python tests/capture/test_capture_imports.py``."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "kiln.capture"

# The largest import cycle allowed: 1 is none at all (issue 22's goal was at most 3).
# Never raise it: route a call that would close a cycle through values.rules instead.
MAX_SCC = 1


def _module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    base = ROOT.joinpath(*PACKAGE.split("."))
    return {_module_name(p): p for p in sorted(base.rglob("*.py"))}


def _resolve(name, modules):
    """The module of ``modules`` that importing ``name`` loads (its longest known prefix)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _runtime_nodes(tree):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only:
    never imported when the program runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def import_graph():
    """module -> set of kiln.capture modules it imports anywhere in its body (function-local
    imports included, type-checking-only ones not)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[:len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                found = _resolve(t, modules)
                if found is not None and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def strongly_connected(graph):
    """Tarjan's components, largest first."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    import sys
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in graph:
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def test_largest_cycle_does_not_grow():
    largest = strongly_connected(import_graph())[0]
    assert len(largest) <= MAX_SCC, (len(largest), largest)


def test_graph_sees_function_local_imports():
    # numpy_calls imports numpy_linalg only inside a function: the measurement must see it
    graph = import_graph()
    assert "kiln.capture.numpy_linalg" in graph["kiln.capture.numpy_calls"]
    graph["kiln.capture.numpy_linalg"].add("kiln.capture.numpy_calls")  # a made-up cycle is found
    assert len(strongly_connected(graph)[0]) == 2


_REGISTERS = re.compile(r"@V\.rule\b|@V\.kind\b|^(BUILTINS|CONST_FOLD)(\[|\.update\()", re.M)


def test_rule_modules_imports_every_registering_module():
    # a module that registers rules but is imported by nobody before a trace would leave
    # its rules missing (an InternalError at the first use)
    listed = import_graph()[f"{PACKAGE}.rule_modules"]
    registering = {name for name, path in _modules().items()
                   if _REGISTERS.search(path.read_text()) and not name.startswith(f"{PACKAGE}.values")}
    assert registering - listed == set()


def test_every_rule_and_kind_used_is_registered():
    # V.rules.NAME / V.kinds.NAME are looked up when called: a name nobody registers
    # would fail only on the path that reaches it
    import kiln.capture.rule_modules  # noqa: F401
    from kiln.capture import values as V

    used = set()
    for path in _modules().values():
        used |= {m.groups() for m in re.finditer(r"(?<![\w.])(?:V\.)?(rules|kinds)\.(\w+)", path.read_text())}
    assert used, "no registry use found"
    missing = {f"{reg}.{name}" for reg, name in used if name not in vars(getattr(V, reg))}
    assert not missing, missing


def test_no_capture_file_over_1000_lines():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > 1000}
    assert not long, long


if __name__ == "__main__":
    g = import_graph()
    comps = strongly_connected(g)
    print(f"{len(g)} modules; components larger than 1:")
    for c in comps:
        if len(c) > 1:
            print(len(c), " ".join(m.rpartition(".")[2] for m in c))
