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
