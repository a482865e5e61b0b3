"""PYTEST_DONT_REWRITE

nn.Module programs: built-in layers (state that changes, like BatchNorm's running
statistics, must persist and match eager's), hooks, containers, parameters and
buffers, ``self.training`` branches, custom modules nesting modules.  Modules are
the program's state: they are compared (state_dict and training flags) after every
call.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import T, check, graph_break, shapes


def _fresh(mod, train=False):
    torch.manual_seed(1)
    return mod.train(train)


class MLP(nn.Module):
    def __init__(self, d=4, h=8):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) + x


class Block(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = MLP(d)
        self.drop = nn.Dropout(0.3)
        self.register_buffer("scale", torch.full((d,), 0.5))

    def forward(self, x):
        y = self.drop(self.mlp(self.norm(x)))
        if self.training:
            return x + y
        return x + y * self.scale


class Counter(nn.Module):
    """Mutates a buffer and a Python attribute on every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))
        self.calls = 0
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.seen += x.shape[0]
        self.calls += 1
        return self.lin(x) * self.seen


def test_linear_call():
    m = _fresh(nn.Linear(4, 3))
    def f(x):
        return m(x)
    check(f, shapes((2, 4)), graphs=1, breaks=0, state=m)


def test_compile_module_directly():
    m = _fresh(MLP())
    check(m, shapes((3, 4)), graphs=1, breaks=0, state=m)


def test_conv2d_module():
    m = _fresh(nn.Conv2d(2, 4, 3, padding=1, stride=2))
    def f(x):
        return m(x).relu()
    check(f, shapes((1, 2, 6, 6)), graphs=1, breaks=0, state=m)


def test_batchnorm_train_running_stats():
    m = _fresh(nn.BatchNorm2d(3), train=True)
    def f(x):
        return m(x)
    check(f, shapes((4, 3, 2, 2)), graphs=1, breaks=0, state=m, calls=4)


def test_batchnorm_eval():
    m = _fresh(nn.BatchNorm2d(3))
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    def f(x):
        return m(x) * 2
    check(f, shapes((2, 3, 2, 2)), graphs=1, breaks=0, state=m)


def test_batchnorm1d_train_in_sequential():
    m = _fresh(nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU()), train=True)
    check(m, shapes((6, 4)), graphs=1, breaks=0, state=m)


def test_dropout_eval_is_identity():
    m = _fresh(nn.Dropout(0.5))
    def f(x):
        return m(x) + 1
    check(f, shapes((4, 4)), graphs=1, breaks=0, state=m)


def test_layernorm_module():
    m = _fresh(nn.LayerNorm([3, 4]))
    check(m, shapes((2, 3, 4)), graphs=1, breaks=0, state=m)


def test_embedding_module():
    m = _fresh(nn.Embedding(10, 3))
    def f(idx):
        return m(idx).sum(1)
    check(f, lambda i: (torch.randint(0, 10, (2, 5)),), graphs=1, breaks=0, state=m)


def test_custom_nested_module_eval():
    m = _fresh(Block())
    check(m, shapes((2, 4)), graphs=1, breaks=0, state=m)


def test_training_flag_branch_recompiles():
    m = _fresh(Block())
    def f(x):
        m.train(x.shape[0] == 3)
        return m.norm(x) * (2 if m.training else 1)
    check(f, lambda i: (T([2, 3, 2][i], 4),), graphs=1, breaks=0, state=m)


def test_module_mutating_buffer_and_attribute():
    m = _fresh(Counter())
    check(m, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_forward_pre_and_post_hooks():
    m = _fresh(nn.Linear(3, 3))
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out + 1)
    def f(x):
        return m(x)
    check(f, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_hook_with_side_effect():
    m = _fresh(nn.ReLU())
    log = []
    m.register_forward_hook(lambda mod, args, out: log.append(out.shape[0]))
    def f(x):
        return m(x) * 2
    check(f, shapes((3,)), graphs=1, breaks=0, state=(m, log))


def test_sequential_iteration_and_indexing():
    m = _fresh(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)))
    def f(x):
        y = x
        for layer in m:
            y = layer(y)
        return y, m[0](x), m[-1](m[1](m[0](x))), len(m)
    check(f, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_sequential_slice():
    m = _fresh(nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)))
    def f(x):
        return m[:2](x), m[1:](x)
    check(f, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_modulelist():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])
        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x) if i % 2 == 0 else x + layer(x)
            return x + self.layers[-1].bias
    m = _fresh(Stack())
    check(m, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_moduledict():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"a": nn.Linear(3, 1), "b": nn.Linear(3, 2)})
        def forward(self, x, which):
            outs = {k: h(x) for k, h in self.heads.items()}
            return outs, self.heads[which](x), "a" in self.heads, list(self.heads.keys())
    m = _fresh(Heads())
    def f(x, which):
        return m(x, which)
    check(f, lambda i: (T(2, 3), ["a", "b", "a"][i]), graphs=1, breaks=0, state=m)


def test_parameters_and_buffers_reads():
    m = _fresh(Block())
    def f(x):
        total = sum(p.sum() for p in m.parameters())
        n = len(list(m.buffers()))
        names = [name for name, _ in m.named_parameters()]
        return x * total + n, names, m.scale * 2
    check(f, shapes((4,)), graphs=1, breaks=0, state=m)


def test_parameter_direct_use():
    m = _fresh(nn.Linear(3, 2))
    def f(x):
        return x @ m.weight.t() + m.bias, m.weight.shape, m.weight.requires_grad
    check(f, shapes((4, 3)), graphs=1, breaks=0, state=m)


def test_module_parameter_grad_flows():
    m = _fresh(nn.Linear(3, 1))
    def f(x):
        out = m(x).sum()
        return out, out.requires_grad
    check(f, shapes((4, 3)), graphs=1, breaks=0, state=m, backward=True)


def test_module_under_no_grad():
    m = _fresh(MLP())
    def f(x):
        with torch.no_grad():
            y = m(x)
        return y, y.requires_grad
    check(f, shapes((2, 4)), graphs=1, breaks=0, state=m)


def test_module_with_graph_break_in_forward():
    class Breaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
        def forward(self, x):
            y = self.a(x)
            graph_break()
            return self.b(y)
    m = _fresh(Breaky())
    check(m, shapes((2, 3)), graphs=2, breaks=1, state=m)


def test_module_attribute_config_branch():
    class Act(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
        def forward(self, x):
            if self.kind == "relu":
                return F.relu(x)
            return torch.tanh(x)
    m1, m2 = Act("relu"), Act("tanh")
    def f(x):
        return m1(x) + m2(x)
    check(f, shapes((4,)), graphs=1, breaks=0, state=(m1, m2))


def test_module_attribute_written_in_forward():
    class Memo(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.last_norm = None
        def forward(self, x):
            y = self.lin(x)
            self.last_norm = y.norm()
            return y
    m = _fresh(Memo())
    check(m, shapes((3, 2)), graphs=1, breaks=0, state=m)


def test_functional_call_on_submodule_weights():
    m = _fresh(nn.Conv2d(1, 2, 3))
    def f(x):
        return F.conv2d(x, m.weight * 2, m.bias, padding=1)
    check(f, shapes((1, 1, 4, 4)), graphs=1, breaks=0, state=m)


def test_mlp_backward_param_grads():
    m = _fresh(MLP())
    check(m, lambda i: (T(2, 4).requires_grad_(),), graphs=1, breaks=0, state=m, backward=True)


def test_batchnorm_train_backward():
    m = _fresh(nn.BatchNorm2d(2), train=True)
    check(m, lambda i: (T(3, 2, 2, 2),), graphs=1, breaks=0, state=m, backward=True)


def test_two_calls_same_module():
    m = _fresh(nn.Linear(3, 3))
    def f(x):
        return m(m(x)) + m(x)
    check(f, shapes((2, 3)), graphs=1, breaks=0, state=m)


def test_module_children_and_modules_iteration():
    m = _fresh(MLP())
    def f(x):
        kinds = [type(c).__name__ for c in m.children()]
        n_linear = sum(isinstance(c, nn.Linear) for c in m.modules())
        return x * n_linear, kinds
    check(f, shapes((3,)), graphs=1, breaks=0, state=m)


def test_inplace_param_update_no_grad():
    m = _fresh(nn.Linear(2, 2))
    def f(x):
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.9)
        return m(x)
    check(f, shapes((3, 2)), graphs=1, breaks=0, state=m)


def test_multihead_attention_eval():
    m = _fresh(nn.MultiheadAttention(8, 2, batch_first=True))
    def f(x):
        out, w = m(x, x, x, need_weights=True)
        return out, w
    check(f, shapes((2, 5, 8)), graphs=1, breaks=0, state=m)
