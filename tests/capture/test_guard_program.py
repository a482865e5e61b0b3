"""Runs of guards evaluated by kiln's C++ library (``capture/guard_program.py``): the
same verdicts as their Python text, in the same order, for every kind of guard, each
change a guard exists for still recompiles, and a miss is still explained in words."""
import logging

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.capture import guard_program as P
from kiln.capture import native_guards
from kiln.capture.guards import same_value


@pytest.fixture(scope="module")
def library():
    why = native_guards.ensure_built()
    assert why is None, f"the native guards did not build here: {why}"
    return native_guards._state["module"]


@pytest.fixture
def verify(monkeypatch):
    """Every program also runs its Python guards and raises where they differ."""
    monkeypatch.setattr(config, "native_guards_verify", True)


class _Obj:
    def __init__(self):
        self.a = 3
        self.t = (1, 2)
        self.f = 0.5
        self.d = {"x": 1, "y": 2}
        self.empty = {}


def _run(library, steps, checks, ends, args=()):
    return library.run_program(library.make_program(steps, checks, ends), args)


def test_each_check_against_python(library):
    o = _Obj()
    # paths: 0 the argument, 1 o.a, 2 o.t, 3 o.f, 4 o.d, 5 o.d['x'], 6 o.empty, 7 o.missing
    steps = [(P.ROOT_ARG, 0, None), (P.ATTR, 0, "a"), (P.ATTR, 0, "t"), (P.ATTR, 0, "f"),
             (P.ATTR, 0, "d"), (P.ITEM, 4, "x"), (P.ATTR, 0, "empty"), (P.ATTR, 0, "missing")]
    cases = [
        ((0, P.TYPE_IS, _Obj, None), True), ((0, P.TYPE_IS, object, None), False),
        ((1, P.IS, 3, None), True), ((1, P.EQ, 3.0, None), True), ((1, P.EQ, 4, None), False),
        ((1, P.TYPED_EQ, int, 3), True), ((3, P.TYPED_EQ, int, 0.5), False),
        ((2, P.IS_OR_CALL, (1, 2), same_value), True), ((2, P.IS_OR_CALL, (1, 3), same_value), False),
        ((2, P.IS_OR_CALL, (1.0, 2), same_value), False),      # item types are exact
        ((3, P.CALL, 0.5, same_value), True), ((3, P.TYPED_CALL, float, (same_value, 0.5)), True),
        ((3, P.TYPED_CALL, float, (same_value, -0.5)), False),
        ((4, P.LEN, 2, None), True), ((4, P.LEN, 3, None), False),
        ((4, P.KEYS, ("x", "y"), None), True), ((4, P.KEYS, ("y", "x"), None), False),
        ((4, P.KEYS_CALL, ("x", "y"), same_value), True),
        ((5, P.EQ, 1, None), True), ((6, P.FALSY, None, None), True), ((4, P.FALSY, None, None), False),
        ((7, P.IS, None, None), False),                         # AttributeError: a miss
    ]
    for check, want in cases:
        assert _run(library, steps, [check], [1], (o,)) is want, check
    # a guard is a conjunction; guards stop at the first failure
    assert _run(library, steps, [cases[0][0], cases[2][0]], [2], (o,)) is True
    assert _run(library, steps, [cases[1][0], cases[2][0]], [1, 2], (o,)) is False
    assert _run(library, steps, [cases[0][0]], [1], ()) is False      # no argument: a miss
    with pytest.raises(ValueError):
        library.make_program([(P.ATTR, 3, "a")], [], [])               # a parent after it


def test_an_exception_that_is_not_an_exception_propagates(library):
    class Stop:
        def __eq__(self, other):
            raise KeyboardInterrupt

    steps = [(P.ROOT_ARG, 0, None)]
    with pytest.raises(KeyboardInterrupt):
        _run(library, steps, [(0, P.EQ, 1, None)], [1], (Stop(),))


def test_a_class_changed_after_the_first_read_is_read_again(library):
    """The instance-attribute shortcut is keyed by the type's version: a property added
    to the class later shadows the instance's value, as it does for Python."""
    class K:
        pass
    k = K()
    k.v = 1
    steps = [(P.ROOT_ARG, 0, None), (P.ATTR, 0, "v")]
    prog = library.make_program(steps, [(1, P.EQ, 1, None)], [1])
    for _ in range(3):
        assert library.run_program(prog, (k,)) is True
    K.v = property(lambda self: 2)
    assert k.v == 2
    assert library.run_program(prog, (k,)) is False
    del K.v
    assert library.run_program(prog, (k,)) is True
    K.__getattribute__ = lambda self, name: 7
    assert library.run_program(prog, (k,)) is False


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                               torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten())


def test_module_guards_run_as_one_program(library, verify):
    net = _net().eval()
    compiled = kiln.compile(lambda x: net(x), backend="eager")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
        torch.testing.assert_close(compiled(x), net(x))
    (entry,) = compiled.entries
    assert entry.source.count(f"{P.NAME}0((") == 1, entry.source
    assert "_forward_hooks" not in entry.source and "padding_mode" not in entry.source
    assert len(entry.guards) > 40


def _changes(net):
    """(what, a change a guard exists for, its undo)."""
    conv, bn = net[0], net[1]

    def hook():
        h = conv.register_forward_hook(lambda m, i, o: o * 2)
        return h.remove
    return [
        ("stride", lambda: setattr(conv, "stride", (2, 2)), lambda: setattr(conv, "stride", (1, 1))),
        ("padding mode", lambda: setattr(conv, "padding_mode", "reflect"),
         lambda: setattr(conv, "padding_mode", "zeros")),
        ("eps", lambda: setattr(bn, "eps", 1e-3), lambda: setattr(bn, "eps", 1e-5)),
        ("training", lambda: bn.train(), lambda: bn.eval()),
        ("a hook", hook, None),
        ("a module swapped", lambda: net.__setitem__(2, torch.nn.Tanh()),
         lambda: net.__setitem__(2, torch.nn.ReLU())),
        ("a module added", lambda: net.append(torch.nn.Identity()), lambda: net.__delitem__(-1)),
        ("a class method", lambda: setattr(torch.nn.ReLU, "forward", lambda self, x: F.relu(x) + 1),
         lambda: setattr(torch.nn.ReLU, "forward", _RELU_FORWARD)),
    ]


_RELU_FORWARD = torch.nn.ReLU.forward


def test_every_change_recompiles_with_eager_values(library, verify, caplog):
    net = _net().eval()
    compiled = kiln.compile(lambda x: net(x), backend="eager")
    x = torch.randn(2, 3, 8, 8)
    try:
        with torch.no_grad(), caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            torch.testing.assert_close(compiled(x), net(x))
            for what, change, undo in _changes(net):
                made = len(compiled.entries)
                undo = change() if undo is None else (change(), undo)[1]
                torch.testing.assert_close(compiled(x), net(x), msg=what)
                assert len(compiled.entries) == made + 1, what
                undo()
                torch.testing.assert_close(compiled(x), net(x), msg=what)
                assert len(compiled.entries) == made + 1, what      # the first entry again
                compiled.entries[1:] = []
        torch.testing.assert_close(compiled(x), net(x))       # grad mode on: a recompile
    finally:
        torch.nn.ReLU.forward = _RELU_FORWARD
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.recompiles")
    for words in ["stride", "padding_mode", "eps", "training", "forward hooks", "type(",
                  "keys of", "ReLU.forward"]:
        assert words in text, (words, text)


def test_verify_catches_a_program_that_disagrees(library, verify, monkeypatch):
    """The check the two mechanisms are held to: a program built from a wrong record
    raises (not as a guard failure, which would be a silent miss)."""
    real = P.build

    def lying_build(codes, records, ns, module, argnames):
        wrong = {c: tuple((p, P.IS, object(), None) if op == P.TYPE_IS else (p, op, a, b)
                          for p, op, a, b in r) for c, r in records.items()}
        return real(codes, wrong, ns, module, argnames)
    monkeypatch.setattr(P, "build", lying_build)
    net = _net().eval()
    compiled = kiln.compile(lambda x: net(x), backend="eager")
    with torch.no_grad(), pytest.raises(P.GuardProgramMismatch):
        compiled(torch.randn(2, 3, 8, 8))


def test_without_the_library_the_guards_stay_python(monkeypatch):
    monkeypatch.setattr(native_guards, "_state", {"module": None, "status": "failed", "why": "test"})
    net = _net().eval()
    compiled = kiln.compile(lambda x: net(x), backend="eager")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
        net[0].stride = (2, 2)
        torch.testing.assert_close(compiled(x), net(x))
    assert len(compiled.entries) == 2
    assert P.NAME not in compiled.entries[0].source
    assert "_forward_hooks" in compiled.entries[0].source
