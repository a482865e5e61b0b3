"""Common access paths of an entry's guards, read once.

A module's guards all start from the same roots: resnet18's 1,151 guards walk
``self._modules['layer1']._modules['0']._modules['conv1']._parameters['weight']`` again
for each of the tensor's dtype, device, shape, stride and requires_grad checks. This
pass turns the guard chain into statements: before the first guard that needs an access
path used more than once, the path is read into a local; later guards (and the graph
call's arguments, evaluated right after with nothing in between) use the local. Guards
still run in their order and stop at the first failure, so a path is only read where
the original ``and`` chain would have read it.
"""
from __future__ import annotations

import bisect
import re
from collections import Counter

# an access path: a name followed by .attr, ['key'] / [int] and .get(<path>) steps; the
# last is a tensor-keyed dict's entry (an optimizer's ``state.get(p)``,
# tensor_keyed_dicts.TensorKeySource), read behind a guard on the dict's exact type, so
# the call has no side effect and reading it once is reading it each time
_PLAIN = r"\.[A-Za-z_]\w*|\['[^'\\\]]*'\]|\[-?\d+\]"
_GET = r"\.get\([A-Za-z_]\w*(?:" + _PLAIN + r")*\)"
_PATH = re.compile(
    r"(?<![\w.'\"\]])([A-Za-z_]\w*)((?:" + _GET + "|" + _PLAIN + r")+)")
_STEP = re.compile(_GET + "|" + _PLAIN)


def _prefixes(m):
    """Every proper access prefix of a matched path (at least one step), shortest
    first; a step followed by '(' is a method lookup and is not cached."""
    root, rest = m.group(1), m.group(2)
    steps = _STEP.findall(rest)
    end = m.end()
    follows_call = m.string[end:end + 1] == "("
    out, cur = [], root
    for i, s in enumerate(steps):
        cur += s
        if i == len(steps) - 1 and follows_call:
            break
        out.append(cur)
    return out


_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def _string_spans(code):
    """Start and end offsets of the string literals in ``code`` (guards hold only
    simple quoted reprs: no triple quotes, no f-strings); a path never starts inside
    one."""
    starts, ends = [], []
    for m in _STRING.finditer(code):
        starts.append(m.start())
        ends.append(m.end())
    return starts, ends


def _matches(code, _memo={}):
    """The access paths of ``code`` outside string literals, in order: (start, end,
    text, prefixes) each. Memoized per guard text: a guard is read several times here
    and the same guard texts recur across a model's layers."""
    found = _memo.get(code)
    if found is None:
        starts, ends = _string_spans(code)
        found = []
        for m in _PATH.finditer(code):
            k = bisect.bisect_right(starts, m.start()) - 1
            if k >= 0 and m.start() < ends[k]:
                continue  # inside a string literal
            found.append((m.start(), m.end(), m.group(0), tuple(_prefixes(m))))
        if len(_memo) > 20000:
            _memo.clear()
        _memo[code] = found
    return found


def path_prefixes(code) -> set[str]:
    """The access paths ``code`` reads through, with its paths' roots: ``x.grad is
    None`` reads through ``x`` (and ``x.grad``, which the set also holds)."""
    out = set()
    for _, _, text, prefixes in _matches(code):
        out.add(_ROOT.match(text).group(0))
        out.update(prefixes)
    return out


_ROOT = re.compile(r"[A-Za-z_]\w*")


def _paths(code):
    found = []
    for _, _, _, prefixes in _matches(code):
        found.extend(prefixes)
    return found


def cse_statements(guard_codes: list[str], tail: str | None = None, indent: str = "        "):
    """(statements for the guard checks, rewritten ``tail`` line or None).

    Each statement is either ``__pN = <path>`` or ``if not (<guard>): return __MISS``.
    """
    uses = Counter()
    for code in guard_codes + ([tail] if tail else []):
        for p in set(_paths(code)):
            uses[p] += 1
    shared = {p for p, n in uses.items() if n > 1}
    names: dict[str, str] = {}
    lines: list[str] = []

    def rewrite(code):
        # each path from its longest prefix that has a local, so a deeper local wins
        # over a shallower one; the text between paths is kept as it is
        out, at = [], 0
        for start, end, full, prefixes in _matches(code):
            best = None
            for p in prefixes:
                if p in names:
                    best = p
            if best is not None:
                out.append(code[at:start])
                out.append(names[best] + full[len(best):])
                at = end
        if not out:
            return code
        out.append(code[at:])
        return "".join(out)

    def define(code):
        for _, _, _, prefixes in _matches(code):
            for p in prefixes:
                if p in shared and p not in names:
                    expr = rewrite(p)
                    name = f"__p{len(names)}"
                    lines.append(f"{indent}{name} = {expr}")
                    names[p] = name

    for code in guard_codes:
        define(code)
        lines.append(f"{indent}if not ({rewrite(code)}):")
        lines.append(f"{indent}    return __MISS")
    new_tail = rewrite(tail) if tail else None
    return lines, new_tail
