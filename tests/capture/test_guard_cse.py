"""The guard CSE pass (kiln.capture.guard_cse): shared access paths become locals read
just before their first use; string literals are left alone; method lookups are not
cached."""
from kiln.capture.guard_cse import cse_statements


def test_shared_paths_are_read_once_before_first_use():
    guards = ["type(self._modules['a']) is T",
              "self._modules['a']._parameters['w'].dtype is D",
              "self._modules['a']._parameters['w'].stride() == (1,)"]
    lines, tail = cse_statements(guards, "__o = __graph0(self._modules['a']._parameters['w'], x)")
    text = "\n".join(lines)
    assert text.count("self._modules") == 1, text  # the root is walked once
    assert "__p0 = self._modules" in text
    assert ".stride()" in text and "stride =" not in text  # method lookups stay calls
    assert tail.startswith("__o = __graph0(__p") and tail.endswith(", x)")
    # the local is defined before the first guard that uses it
    first_use = next(i for i, ln in enumerate(lines) if "if not" in ln and "__p" in ln)
    assert any("__p0 =" in ln for ln in lines[:first_use])


def test_paths_inside_string_literals_are_not_rewritten():
    guards = ["a.b.c == 'x a.b.c'", "a.b.c is not None"]
    lines, _ = cse_statements(guards)
    assert any("'x a.b.c'" in ln for ln in lines), lines


def test_semantics_match_the_and_chain():
    class O:
        pass
    o = O()
    o.k = {"a": 1}
    guards = ["o.k['a'] == 1", "o.k['b'] == 2"]  # the second raises KeyError: a miss
    lines, _ = cse_statements(guards, indent="    ")
    src = "def g(o):\n  try:\n" + "\n".join("  " + ln for ln in lines) + "\n  except Exception:\n    return 'miss'\n  return 'hit'\n"
    ns = {"__MISS": "miss"}
    exec(src, ns)
    assert ns["g"](o) == "miss"
    o.k["b"] = 2
    assert ns["g"](o) == "hit"


def test_a_tensor_keyed_dict_entry_is_read_once():
    """An optimizer's ``state.get(p)`` (tensor_keyed_dicts) is one path step: each
    parameter's entry is looked up once, not once per guard on its moments."""
    entry = "opt.state.get(opt.param_groups[0]['params'][0])"
    guards = [f"type({entry}) is D", f"{entry}['step'].dtype is F",
              f"{entry}['exp_avg'].shape == (3,)", f"{entry}['exp_avg'].stride() == (1,)",
              "env.get('KILN_X') == '1'", "env.get('KILN_X') is not None"]
    lines, tail = cse_statements(guards, f"__o = __graph0({entry}['exp_avg'])")
    text = "\n".join(lines)
    assert text.count(".get(opt") == 1, text
    assert tail.startswith("__o = __graph0(__p") and ".get(" not in tail
    assert text.count("env.get('KILN_X')") == 2      # a call on a literal stays a call
    import torch
    state = {}
    p = torch.zeros(3)

    class Opt:
        pass
    opt = Opt()
    opt.state, opt.param_groups = state, [{"params": [p]}]
    state[p] = {"step": torch.zeros(()), "exp_avg": torch.zeros(3)}
    src = ("def g(opt, env):\n  try:\n" + "\n".join("  " + ln for ln in lines) +
           "\n  except Exception:\n    return 'miss'\n  return 'hit'\n")
    ns = {"__MISS": "miss", "D": dict, "F": torch.float32}
    exec(src, ns)
    assert ns["g"](opt, {"KILN_X": "1"}) == "hit"
    state[p]["exp_avg"] = torch.zeros(4)
    assert ns["g"](opt, {"KILN_X": "1"}) == "miss"


def _reference(guard_codes, tail=None, indent="        "):
    """The pass written plainly: every guard's paths found and rewritten by regex
    substitution (what cse_statements computes from its memoized matches)."""
    import bisect
    from collections import Counter
    from kiln.capture import guard_cse as G

    def valid(code):
        starts, ends = G._string_spans(code)
        out = []
        for m in G._PATH.finditer(code):
            k = bisect.bisect_right(starts, m.start()) - 1
            if not (k >= 0 and m.start() < ends[k]):
                out.append(m)
        return out

    uses = Counter()
    for code in guard_codes + ([tail] if tail else []):
        for p in {p for m in valid(code) for p in G._prefixes(m)}:
            uses[p] += 1
    shared = {p for p, n in uses.items() if n > 1}
    names, lines = {}, []

    def rewrite(code):
        ok = {m.start() for m in valid(code)}

        def sub(m):
            best = None
            for p in G._prefixes(m):
                if p in names:
                    best = p
            if m.start() not in ok or best is None:
                return m.group(0)
            return names[best] + m.group(0)[len(best):]
        return G._PATH.sub(sub, code)

    for code in guard_codes:
        for m in valid(code):
            for p in G._prefixes(m):
                if p in shared and p not in names:
                    expr = rewrite(p)
                    names[p] = f"__p{len(names)}"
                    lines.append(f"{indent}{names[p]} = {expr}")
        lines += [f"{indent}if not ({rewrite(code)}):", f"{indent}    return __MISS"]
    return lines, (rewrite(tail) if tail else None)


def test_same_statements_as_the_plain_pass():
    guards = []
    for layer in range(4):
        m = f"__G['m']._modules['h']._modules['{layer}']"
        for p in ("weight", "bias"):
            t = f"{m}._parameters['{p}']"
            guards += [f"type({t}) is __T1", f"{t}.dtype is __dt2", f"{t}.shape == (4,)",
                       f"{t}.stride() == (1,)", f"{t}.requires_grad is True"]
        guards += [f"not {m}._forward_hooks and not {m}._forward_pre_hooks",
                   f"{m}.eps == 1e-05 and {m}.name == 'x {m}.eps'",
                   f"opt.state.get({m}._parameters['weight'])['step'] == 3",
                   f"{m}.training is True"]
    tail = "__o = __graph0(" + ", ".join(
        f"__G['m']._modules['h']._modules['{i}']._parameters['weight']" for i in range(4)) + ")"
    assert cse_statements(guards, tail) == _reference(guards, tail)
    lines, _ = cse_statements(guards, tail)
    assert sum("__G['m']._modules['h']" in ln for ln in lines) < len(guards) // 4
