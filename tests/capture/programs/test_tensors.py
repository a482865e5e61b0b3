"""PYTEST_DONT_REWRITE

Tensor programs: torch functions, Tensor methods and attributes, operators (reflected
and in-place), dtype/device conversions, creation functions, torch.nn.functional.
"""
import torch
import torch.nn.functional as F

from .harness import T, check, shapes


# ---------------------------------------------------------------- torch functions

def test_add_mul():
    def f(x, y):
        return torch.add(x, y) * torch.mul(x, 2.0)
    check(f, shapes((3, 4), (3, 4)), graphs=1, breaks=0)


def test_pointwise_chain():
    def f(x):
        return torch.sigmoid(torch.tanh(torch.exp(x * 0.1)) - torch.cos(x)).abs().sqrt()
    check(f, shapes((5, 6)), graphs=1, breaks=0)


def test_reductions():
    def f(x):
        return x.sum(), x.mean(dim=1), x.amax(0), torch.prod(x, dim=-1, keepdim=True), x.var(1)
    check(f, shapes((4, 5)), graphs=1, breaks=0)


def test_max_with_indices():
    def f(x):
        values, idx = torch.max(x, dim=1)
        return values * 2, idx + 1
    check(f, shapes((4, 7)), graphs=1, breaks=0)


def test_matmul_family():
    def f(a, b, c):
        return torch.mm(a, b), torch.matmul(a, b) + 1, torch.bmm(c, c.transpose(1, 2)), torch.einsum("ij,jk->ik", a, b)
    check(f, shapes((3, 4), (4, 5), (2, 3, 3)), graphs=1, breaks=0)


def test_cat_stack_where():
    def f(x, y):
        z = torch.cat([x, y], dim=0)
        s = torch.stack((x, y), dim=-1)
        return torch.where(z > 0, z, torch.zeros_like(z)), s.sum(-1)
    check(f, shapes((2, 3), (2, 3)), graphs=1, breaks=0)


def test_clamp_minimum_maximum():
    def f(x, y):
        return torch.clamp(x, -0.5, 0.5) + torch.maximum(x, y) - torch.minimum(x, y).clamp(min=0)
    check(f, shapes((8,), (8,)), graphs=1, breaks=0)


def test_cumsum_sort_topk():
    def f(x):
        v, i = torch.sort(x, dim=-1, descending=True)
        t = torch.topk(x, 2).values
        return torch.cumsum(x, 1), v, i, t
    check(f, shapes((3, 6)), graphs=1, breaks=0)


def test_softmax_logsumexp():
    def f(x):
        return torch.softmax(x, -1), torch.logsumexp(x, dim=0), torch.log_softmax(x, 1)
    check(f, shapes((4, 5)), graphs=1, breaks=0)


def test_integer_tensor_ops():
    def f(a, b):
        return a + b, a * 3, a // 2, a % 3, a & b, a | b, a ^ b, a << 1
    check(f, lambda i: (T(6, dtype=torch.int64), T(6, dtype=torch.int64)), graphs=1, breaks=0)


def test_bool_tensor_ops():
    def f(a, b):
        return a & b, a | b, ~a, a.logical_xor(b), a.any(), b.all()
    check(f, lambda i: (T(5, dtype=torch.bool), T(5, dtype=torch.bool)), graphs=1, breaks=0)


# ---------------------------------------------------------------- methods / attributes

def test_shape_attributes():
    def f(x):
        n, m = x.shape
        return x.reshape(m, n) * x.ndim + x.size(0) + x.dim() + len(x.shape) + x.numel()
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_size_method_tuple():
    def f(x):
        s = x.size()
        return x.new_zeros(s[0], s[1]) + x[:, :, 0], s
    check(f, shapes((2, 3, 4)), graphs=1, breaks=0)


def test_dtype_device_attributes():
    def f(x):
        y = torch.zeros(3, dtype=x.dtype, device=x.device)
        return y + 1, x.dtype, x.device, x.is_floating_point()
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_transpose_attribute_T():
    def f(x):
        return x.T @ x, x.mT.shape
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_requires_grad_attribute():
    def f(x, w):
        y = x * w
        return y, y.requires_grad, x.requires_grad, w.is_leaf
    check(f, lambda i: (T(3), T(3).requires_grad_()), graphs=1, breaks=0)


def test_method_chain():
    def f(x):
        return x.add(1).mul_(2).sub(x).div(3).neg().exp().log1p()
    check(f, shapes((4,)), graphs=1, breaks=0)


def test_contiguous_clone_detach():
    def f(x):
        y = x.t().contiguous().clone()
        return y.detach() + 1, y.is_contiguous()
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_type_as_and_new_ones():
    def f(x, y):
        return y.type_as(x) + x.new_ones(x.shape), x.new_full((2,), 3.0)
    check(f, lambda i: (T(2), T(2, dtype=torch.int64)), graphs=1, breaks=0)


# ---------------------------------------------------------------- operators

def test_binary_operators():
    def f(x, y):
        return x + y, x - y, x * y, x / y, x ** 2, -x, +x, abs(x)
    check(f, shapes((4,), (4,)), graphs=1, breaks=0)


def test_reflected_operators():
    def f(x):
        return 1 + x, 2 - x, 3 * x, 1 / (x.abs() + 1), 2 ** x, 7 // (x.abs() + 1), 5 % (x.abs() + 1)
    check(f, shapes((5,)), graphs=1, breaks=0)


def test_matmul_operator():
    def f(a, b):
        return a @ b, (a @ b) @ b.T
    check(f, shapes((3, 3), (3, 3)), graphs=1, breaks=0)


def test_floordiv_mod_float():
    def f(x, y):
        return x // (y.abs() + 0.5), x % (y.abs() + 0.5), divmod(7, 3)
    check(f, shapes((6,), (6,)), graphs=1, breaks=0)


def test_comparison_operators():
    def f(x, y):
        return x < y, x <= y, x > 0, x >= y, x == y, x != y, (x > 0) & (y < 0)
    check(f, shapes((6,), (6,)), graphs=1, breaks=0)


def test_invert_int_and_bool():
    def f(a, m):
        return ~a, ~m, -a
    check(f, lambda i: (T(4, dtype=torch.int32), T(4, dtype=torch.bool)), graphs=1, breaks=0)


def test_inplace_operators_local():
    def f(x):
        y = x.clone()
        y += 1
        y *= 2
        y -= x
        y /= 3
        y **= 2
        return y
    check(f, shapes((4,)), graphs=1, breaks=0)


def test_inplace_operator_on_input():
    def f(x, y):
        x += y
        x.mul_(2)
        return x.sum()
    check(f, shapes((3,), (3,)), graphs=1, breaks=0)


def test_inplace_on_view_of_input():
    def f(x):
        v = x[0]
        v.add_(10)
        x[1].zero_()
        return x * 1
    check(f, shapes((3, 2)), graphs=1, breaks=0)


def test_inplace_matmul_operator():
    def f(a, b):
        a @= b
        return a
    check(f, shapes((3, 3), (3, 3)), graphs=1, breaks=0)


def test_inplace_int_floordiv_mod():
    def f(a):
        a //= 2
        b = a.clone()
        b %= 3
        return a, b
    check(f, lambda i: (T(7, dtype=torch.int64),), graphs=1, breaks=0)


def test_python_scalar_with_tensor():
    def f(x):
        s = 0.5 * 3 + 1
        return x * s + len([1, 2, 3])
    check(f, shapes((3,)), graphs=1, breaks=0)


# ---------------------------------------------------------------- conversions

def test_dtype_conversions():
    def f(x):
        return x.float(), x.double(), x.half().float(), x.long(), x.int(), x.bool(), x.to(torch.float64)
    check(f, lambda i: (T(5) * 5,), graphs=1, breaks=0)


def test_to_other_tensor():
    def f(x, y):
        return x.to(y) + y, x.to(dtype=torch.float16).dtype
    check(f, lambda i: (T(3), T(3, dtype=torch.float64)), graphs=1, breaks=0)


def test_to_device_cpu():
    def f(x):
        return x.to("cpu") * 2, x.cpu().device, x.to(x.device, torch.float64)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_int_tensor_promotion():
    def f(a, x):
        return a * x, a / 2, (a + 1.5).dtype
    check(f, lambda i: (T(4, dtype=torch.int64), T(4)), graphs=1, breaks=0)


# ---------------------------------------------------------------- creation

def test_creation_functions():
    def f(x):
        a = torch.zeros(2, 3)
        b = torch.ones((2, 3), dtype=torch.float64)
        c = torch.full((2, 3), 7.0)
        d = torch.arange(6).reshape(2, 3)
        e = torch.eye(3)[:2]
        return a + b + c + d + e + x
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_like_creation():
    def f(x):
        return torch.zeros_like(x), torch.ones_like(x) * x, torch.full_like(x, 2.5), torch.empty_like(x).shape
    check(f, shapes((3, 2)), graphs=1, breaks=0)


def test_arange_linspace():
    def f(n, x):
        return torch.arange(0, n, 2), torch.linspace(0, 1, steps=5) * x.sum(), torch.arange(n, dtype=torch.float32) + x[0]
    check(f, lambda i: (6, T(3)), graphs=1, breaks=0)


def test_tensor_constructor_from_python():
    def f(x):
        t = torch.tensor([1.0, 2.0, 3.0])
        return x + t, torch.as_tensor([[1, 2], [3, 4]]).sum()
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_creation_sized_by_input():
    def f(x):
        m = torch.ones(x.shape[0], x.shape[0]).tril()
        return m @ x
    check(f, lambda i: (T(3 + i, 2),), graphs=1, breaks=0)


# ---------------------------------------------------------------- nn.functional

def test_functional_activations():
    def f(x):
        return F.relu(x), F.gelu(x), F.silu(x), F.leaky_relu(x, 0.1), F.elu(x), F.softplus(x)
    check(f, shapes((4, 5)), graphs=1, breaks=0)


def test_functional_gelu_tanh():
    def f(x):
        return F.gelu(x, approximate="tanh")
    check(f, shapes((8,)), graphs=1, breaks=0)


def test_functional_softmax_dim_kw():
    def f(x):
        return F.softmax(x, dim=-1) * F.log_softmax(x, dim=0)
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_functional_layer_norm():
    def f(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
    check(f, shapes((2, 3, 8), (8,), (8,)), graphs=1, breaks=0)


def test_functional_linear():
    def f(x, w, b):
        return F.linear(x, w, b), F.linear(x, w)
    check(f, shapes((4, 3), (5, 3), (5,)), graphs=1, breaks=0)


def test_functional_conv2d():
    def f(x, w, b):
        return F.conv2d(x, w, b, stride=1, padding=1)
    check(f, shapes((1, 2, 5, 5), (3, 2, 3, 3), (3,)), graphs=1, breaks=0)


def test_functional_dropout_eval():
    def f(x):
        return F.dropout(x, p=0.5, training=False) + 1
    check(f, shapes((4, 4)), graphs=1, breaks=0)


def test_functional_pad():
    def f(x):
        return F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=3.0)
    check(f, shapes((2, 3, 4)), graphs=1, breaks=0)


def test_functional_cross_entropy():
    def f(logits, target):
        return F.cross_entropy(logits, target), F.cross_entropy(logits, target, reduction="none")
    check(f, lambda i: (T(4, 5), torch.randint(0, 5, (4,))), graphs=1, breaks=0)


def test_functional_pooling_and_normalize():
    def f(x):
        return F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.normalize(x.flatten(1), dim=1)
    check(f, shapes((1, 2, 4, 4)), graphs=1, breaks=0)


def test_functional_mse_one_hot_embedding():
    def f(x, y, idx, table):
        return F.mse_loss(x, y), F.one_hot(idx, 5), F.embedding(idx, table)
    check(f, lambda i: (T(3), T(3), torch.randint(0, 5, (4,)), T(5, 2)), graphs=1, breaks=0)
