"""The size-generic cases (``size_generic_cases.py``) through the Triton path, under
TRITON_INTERPRET=1: a new size of a class loads no new module (on a GPU: compiles no
kernel). Not collected by the normal run: ``test_size_generic_triton.py`` runs this
file in a child pytest with the interpreter on before triton is imported."""
import os

import pytest
import torch

from kiln.kernels.codegen.triton import launcher

from .size_generic_cases import CASES, SIZES, lifting, mlp_training_step_costs, pointwise, run_odd, run_sizes

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_size_generic_triton.py)")


@pytest.fixture(autouse=True)
def _divisors_as_arguments(monkeypatch):
    """Static graphs' Triton kernels divide by literals (``config.triton_literal_divisors``),
    which gives up sharing a binary across sizes for the kernels that divide (every
    case here has one): these tests check the sharing itself, as symbolic graphs use it."""
    from kiln import config
    monkeypatch.setattr(config, "triton_literal_divisors", False)


def loads():
    return launcher.stats["loaded"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_module_per_size_class(case):
    name, fn, make, sizes = case
    costs, alive = run_sizes(fn, make, sizes, "triton", loads)
    assert costs[0] == 1 and costs[1:] == [0] * (len(sizes) - 1), costs
    src = alive[0].artefacts["source"]
    assert "kiln_ks" in src and "G[0]" in src


def test_a_multiple_of_16_is_its_own_class():
    """Triton's divisibility specialisation, decided by kiln: a size that becomes a
    multiple of 16 is declared one (vector loads), in a module of its own."""
    costs, alive = run_sizes(pointwise, CASES[0][2], [(34, 39), (32, 39), (48, 39)],
                             "triton", loads)
    assert costs == [1, 1, 0], costs
    assert "tl.multiple_of" in alive[1].artefacts["source"]
    assert "tl.multiple_of" not in alive[0].artefacts["source"]


def test_literal_divisors_load_a_module_per_size(monkeypatch):
    """The trade the default makes for a static graph: a kernel dividing by a column
    count is a text per size (its divisor a literal), hence a module per size."""
    from kiln import config
    monkeypatch.setattr(config, "triton_literal_divisors", True)
    costs, alive = run_sizes(pointwise, CASES[0][2], SIZES, "triton", loads)
    assert costs == [1, 1, 1], costs
    assert "% 39" in alive[0].artefacts["source"]


def test_without_size_args_every_size_loads():
    with lifting(False):
        costs, _ = run_sizes(pointwise, CASES[0][2], SIZES, "triton", loads)
    assert costs == [1, 1, 1], costs


@pytest.mark.parametrize("case", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_odd_sizes_and_layouts(case):
    run_odd(case[1], "triton")


def test_mlp_training_step_through_kiln_compile():
    """Batch 34 compiles static; 41 makes the batch dynamic, whose Triton kernels lift
    every size (``size_args.lifting(..., every=True)``: texts of their own, once); 47
    loads nothing."""
    costs = mlp_training_step_costs(loads, kernel_target="triton")
    assert costs[0] >= 1 and costs[1] <= costs[0] and costs[2] == 0, costs


def test_looped_reductions_share_across_lengths():
    """Rows longer than a persistent block loop over RBLOCK steps up to a size
    argument: lengths of one class share the module."""
    def f(x):
        return x.sum(-1), torch.softmax(x, -1)
    costs, _ = run_sizes(f, lambda r, c: (torch.randn(r, c),), [(3, 9001), (3, 10007), (3, 12011)],
                         "triton", loads)
    assert costs == [1, 0, 0], costs


@pytest.mark.parametrize("batches", [(3, 5, 7, 9), (6, 2, 10, 14)], ids=["odd", "even"])
def test_small_batches_share_one_module_with_large_ones(batches):
    """A conv net over a batch marked dynamic: a batch of 3 equals the image's 3
    channels and its 3x3 kernel, a batch of 2 the pooling stride. Its Triton kernels
    name every lifted size on its own (``size_args.lifting(..., every=True)``), so
    those coincidences make no text of their own: the batches of each stream (the same
    divisibility class: odd, or twice an odd number) load one module (before, 2 and 3
    each loaded theirs)."""
    import kiln
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(3, 2, 1), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 5 * 5, 6)).eval()
    compiled = kiln.compile(net)
    costs = []
    with kiln.config.patch(perf_fallback=False, kernel_target="triton"), torch.no_grad():
        for b in batches:
            x = torch.randn(b, 3, 10, 10)
            if b == batches[0]:
                kiln.mark_dynamic(x, 0)
            before = loads()
            got = compiled(x)
            costs.append(loads() - before)
            torch.testing.assert_close(got, net(x), rtol=1e-5, atol=1e-5)
    # the first batch's module may be loaded already (the other stream's, when the
    # divisibility of its sizes is the same)
    assert costs[0] <= 1 and costs[1:] == [0, 0, 0], costs


def _symbolic_plans(monkeypatch) -> list:
    """The sources planned for a symbolic graph's sizes, filled as they are planned."""
    from kiln.kernels import compile as kc
    sources, plan = [], kc.plan

    def spied(gm, *a, **k):
        p = plan(gm, *a, **k)
        if gm.meta.get(kc.SYMBOL_VALUES):
            sources.append(p.source)
        return p
    monkeypatch.setattr(kc, "plan", spied)
    return sources


def _stream_loads(compiled, eager, inputs, dim) -> list:
    """Per call of a stream (its first input marked dynamic at ``dim``), the modules it
    loaded; every result checked against ``eager``'s."""
    import kiln
    costs = []
    with kiln.config.patch(perf_fallback=False, kernel_target="triton",
                           background_size_plans=False), torch.no_grad():
        for i, x in enumerate(inputs):
            if i == 0:
                kiln.mark_dynamic(x, dim)
            before = loads()
            got = compiled(x)
            costs.append(loads() - before)
            torch.testing.assert_close(got, eager(x), rtol=1e-5, atol=1e-5)
    return costs


@pytest.mark.parametrize("literal", [True, False], ids=["literal_divisors", "argument_divisors"])
def test_a_dynamic_batch_divides_by_literal_divisors(literal, monkeypatch):
    """Under a dynamic batch, a conv net's pointwise and pool kernels divide only by
    sizes no symbolic size of the graph has (channels, widths): with
    ``config.triton_literal_divisors`` those are literals, and batches that equal none of
    them share one module as before; without it, they are size arguments divided by
    magic numbers."""
    import kiln
    monkeypatch.setattr(kiln.config, "triton_literal_divisors", literal)
    sources = _symbolic_plans(monkeypatch)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(3, 2, 1), torch.nn.Flatten(),
                              torch.nn.Linear(6 * 5 * 5, 6)).eval()

    def forward(x):       # a code object of its own (Sequential's has many entries by now)
        return net(x)
    costs = _stream_loads(kiln.compile(forward), net,
                          [torch.randn(b, 3, 10, 10) for b in (7, 9, 11, 13)], 0)
    assert costs[0] <= 1 and costs[1:] == [0, 0, 0], costs
    assert sources and all("kiln_ks" in s for s in sources), sources
    assert any("kiln_udivm(xindex" in s for s in sources) != literal, sources


def test_a_symbolic_divisor_stays_an_argument(monkeypatch):
    """A kernel dividing by a dynamic length (a transpose of [2, S, 8] made contiguous:
    the flat index split by S) keeps that divisor a size argument, so the lengths of a
    stream share one module, while its other divisor (8) is a literal."""
    import kiln
    monkeypatch.setattr(kiln.config, "triton_literal_divisors", True)
    sources = _symbolic_plans(monkeypatch)

    def f(x):
        return x.transpose(1, 2).contiguous() * 2
    costs = _stream_loads(kiln.compile(f), f, [torch.randn(2, s, 8) for s in (21, 23, 29, 31)], 1)
    assert costs[0] <= 1 and costs[1:] == [0, 0, 0], costs
    body = sources[0].split("def kernel", 1)[1]
    assert "kiln_udivm(xindex" in body and "% 8" in body, body
