"""kiln never loads PyTorch's own compiler (DESIGN.md), not even through PyTorch's
lazy "do not trace this" wrappers: the dispatch modes kiln defines and the Python meta
kernels of elementwise ops both import ``torch._dynamo`` on their first call unless kiln
spares them (``kiln/dispatch_mode.py``) — 1.7 to 3.7 s of a small function's first
call. Checked in a fresh process, through capture, the autograd stage (training and
inference) and the kernel compiler."""
import subprocess
import sys

PROGRAM = r"""
import sys, torch, kiln

def f(x, w):
    y = torch.sin(x) + torch.cos(x) * 2
    return torch.softmax(y @ w, -1).sum(), torch.nn.functional.layer_norm(y, (8,))

x = torch.randn(4, 8, requires_grad=True)
w = torch.randn(8, 8)
loss, ln = kiln.compile(f)(x, w)
loss.backward()
with torch.no_grad():
    kiln.compile(lambda a: torch.tanh(a) / 3)(torch.randn(5))
ref = torch.softmax((torch.sin(x) + torch.cos(x) * 2) @ w, -1).sum()
assert torch.allclose(loss, ref), (loss, ref)
print("dynamo" if "torch._dynamo" in sys.modules else "clean")
"""


CHECK = r"""
import gc, torch._compile, torch._dynamo
from kiln.dispatch_mode import _UntilCompilerLoaded
torch.compile(lambda a: torch.sin(a) + 1, backend="eager")(torch.randn(3))
# a spared wrapper reached while PyTorch's compiler traces (``is_compiling()`` reads True)
torch.compiler.is_compiling = lambda: True
kiln.compile(lambda a: torch.sin(a) * 5)(torch.randn(3))   # runs sin's meta kernel again
code = torch._compile._disable_dynamo(lambda: None).__code__
fns = [dict(zip(w.__code__.co_freevars, w.__closure__))["fn"].cell_contents
       for w in gc.get_referrers(code) if getattr(w, "__closure__", None)]
restored = [f for f in fns if getattr(f, "__dynamo_disable", None) is not None
            and not isinstance(f.__dynamo_disable, _UntilCompilerLoaded)]
assert restored, "no wrapper went back to PyTorch's own disable"
"""


def test_kiln_does_not_import_torch_dynamo():
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "clean", r.stdout


def test_the_spared_wrappers_behave_as_pytorch_once_its_compiler_is_loaded():
    """Reached while PyTorch's compiler traces (``torch.compiler.is_compiling()``), the
    wrappers go back to PyTorch's own behaviour."""
    prog = PROGRAM.replace('print("dynamo"', CHECK + 'print("dynamo"')
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "dynamo", r.stdout
