"""Failures of a backend or of kiln itself, never the program's: with suppress_errors
on the function (or graph) runs eagerly with a warning and the eager result; with it
off the error names the backend and the user's file, line and source text, the
original exception kept as ``__cause__``. A program's own error stays the program's."""
import inspect
import logging

import pytest
import torch

import kiln
from kiln import config
from kiln.capture.errors import BackendCompilerFailed, InternalError


def _prog(x):
    y = x * 2
    return y.sin() + 1  # the graph's last line


_LAST_LINE = "return y.sin() + 1  # the graph's last line"


def _prog_with_break(x):
    y = x * 2
    kiln.graph_break()
    return y.sin() + 1  # the graph's last line


def _fails_compiling(gm, example_inputs):
    raise ValueError("backend cannot compile")


def _fails_running(gm, example_inputs):
    def run(*args):
        raise ValueError("backend cannot run")
    return run


def _fails_running_after_mutating(gm, example_inputs):
    def run(*args):
        args[0].add_(1)
        raise ValueError("backend cannot run")
    return run


class _CallableBackend:  # a backend object (not a function), run by its __call__
    def __call__(self, gm, example_inputs):
        return _fails_running(gm, example_inputs)


def _user_line(text):
    return f"{__file__}:" in text and _LAST_LINE in text


@pytest.fixture
def suppress(monkeypatch):
    def set_(on):
        monkeypatch.setattr(config, "suppress_errors", on)
    yield set_
    kiln.reset()


@pytest.mark.parametrize("backend", [_fails_compiling, _fails_running, _CallableBackend()])
@pytest.mark.parametrize("prog", [_prog, _prog_with_break])
def test_backend_failure_falls_back_to_eager_when_suppressed(backend, prog, suppress, caplog):
    suppress(True)
    cf = kiln.compile(prog, backend=backend)
    for _ in range(3):
        x = torch.randn(3)
        with caplog.at_level(logging.WARNING, logger="kiln"):
            torch.testing.assert_close(cf(x), prog(x))
    assert "backend cannot" in caplog.text


@pytest.mark.parametrize("backend,phase", [(_fails_compiling, "compiling"), (_fails_running, "running"),
                                           (_CallableBackend(), "running")])
@pytest.mark.parametrize("prog", [_prog, _prog_with_break])
def test_backend_failure_names_the_backend_and_the_users_line(backend, phase, prog, suppress):
    suppress(False)
    cf = kiln.compile(prog, backend=backend)
    with pytest.raises(BackendCompilerFailed) as info:
        cf(torch.randn(3))
    err = info.value
    assert isinstance(err.__cause__, ValueError) and "backend cannot" in str(err.__cause__)
    text = str(err)
    name = getattr(backend, "__name__", type(backend).__qualname__)
    assert repr(name) in text and phase in text and "ValueError" in text, text
    if prog is _prog:
        assert _user_line(text), text
    else:  # the first graph ends at the break
        assert "kiln.graph_break()" in text and f"{__file__}:" in text, text


def test_programs_own_error_at_the_first_run_stays_the_programs(suppress):
    """aot_eager's first run raises where eager raises too (an index out of range):
    eager's exception, not a backend failure."""
    suppress(False)

    def f(x, idx):
        return torch.index_select(x * 2, 0, idx)
    cf = kiln.compile(f, backend="aot_eager")
    x, bad = torch.randn(3), torch.tensor([0, 7])
    with pytest.raises(Exception) as eager:
        f(x, bad)
    with pytest.raises(Exception) as compiled:
        cf(x, bad)
    assert type(compiled.value) is type(eager.value)
    assert not isinstance(compiled.value, BackendCompilerFailed)
    torch.testing.assert_close(cf(x, torch.tensor([2, 0])), f(x, torch.tensor([2, 0])))


def test_failed_run_that_mutated_its_inputs_is_not_repeated(suppress):
    """A backend that changed an input before failing cannot be rerun eagerly (the
    change would happen twice): its exception is raised as it is."""
    suppress(True)

    def f(x):
        return x * 2
    cf = kiln.compile(f, backend=_fails_running_after_mutating)
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="backend cannot run"):
        cf(x)
    assert torch.equal(x, torch.ones(3))  # added once, by the backend only


@pytest.fixture
def broken_fake_propagation(monkeypatch):
    """kiln's fake propagation fails with an error of its own (a kiln bug)."""
    from kiln.capture import fake

    def broken(*args, **kwargs):
        raise KeyError("a kiln bug in shape propagation")
    monkeypatch.setattr(fake, "_pick_device", broken)
    yield monkeypatch
    kiln.reset()


def _inner(y):
    return y.cos()  # the failing op, inlined


def _calls_inner(x):
    y = x  # no op yet: the first one fails
    return _inner(y)


def test_internal_error_names_the_users_lines(broken_fake_propagation):
    broken_fake_propagation.setattr(config, "suppress_errors", False)
    cf = kiln.compile(_calls_inner, backend="eager")
    with pytest.raises(InternalError) as info:
        cf(torch.randn(3))
    text = str(info.value)
    assert isinstance(info.value.__cause__, KeyError) and "KeyError" in text, text
    # the deepest line being traced, with the call leading to it
    assert "return _inner(y)" in text and "return y.cos()  # the failing op, inlined" in text, text
    assert f"{__file__}:{inspect.getsourcelines(_inner)[1] + 1}" in text, text


def test_unsupported_under_fullgraph_names_the_users_line():
    def f(x):
        y = x + 1
        print("a side effect")  # cannot be captured
        return y
    with pytest.raises(kiln.Unsupported) as info:
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    assert f"{__file__}:" in str(info.value) and 'print("a side effect")' in str(info.value)
    kiln.reset()


def test_a_frame_that_cannot_compile_under_fullgraph_names_the_function():
    def gen(x):
        yield x
    with pytest.raises(kiln.Unsupported) as info:
        kiln.compile(gen, backend="eager", fullgraph=True)(torch.randn(3))
    assert f"{__file__}:" in str(info.value) and "def gen(x):" in str(info.value)
    kiln.reset()


def test_a_return_value_that_cannot_be_rebuilt_under_fullgraph_names_the_line(monkeypatch):
    from kiln.capture import codegen
    from kiln.capture.errors import Unsupported

    def cannot(self, v):
        raise Unsupported("a value kiln cannot rebuild")
    monkeypatch.setattr(codegen.EntryCodegen, "expr", cannot)

    def f(x):
        return x + 1  # returned here
    with pytest.raises(kiln.Unsupported) as info:
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    assert "cannot rebuild" in str(info.value) and "return x + 1  # returned here" in str(info.value)
    kiln.reset()
