"""PYTEST_DONT_REWRITE

User objects: classes with methods, properties, static/class methods, super(),
dataclasses, namedtuples, dunder protocols; attribute reads and writes (the mutated
object is compared after every call).
"""
import collections
import dataclasses
import typing

import torch

from .harness import T, check, dynamo_bug, shapes


class Scaler:
    factor = 2.0

    def __init__(self, bias):
        self.bias = bias
        self.calls = 0

    def apply(self, x):
        self.calls += 1
        return x * self.factor + self.bias

    @property
    def doubled(self):
        return self.bias * 2

    @staticmethod
    def square(x):
        return x * x

    @classmethod
    def make(cls, b):
        return cls(b)


class Base:
    def __init__(self):
        self.scale = 2

    def forward(self, x):
        return x * self.scale


class Child(Base):
    def __init__(self):
        super().__init__()
        self.shift = 1

    def forward(self, x):
        return super().forward(x) + self.shift


class Seq:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __call__(self, x):
        for it in self.items:
            x = x + it
        return x

    def __contains__(self, v):
        return v in self.items


@dataclasses.dataclass
class Config:
    hidden: int = 4
    act: str = "relu"
    scale: float = 1.0


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor

    def total(self):
        return self.a + self.b


Point = collections.namedtuple("Point", ["x", "y"])


class Span(typing.NamedTuple):
    lo: torch.Tensor
    hi: torch.Tensor
    tag: str = "span"


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __neg__(self):
        return Vec(-self.t)


def test_method_call_on_existing_object():
    s = Scaler(0.5)
    def f(x):
        return s.apply(x) + s.apply(-x)
    check(f, shapes((3,)), graphs=1, breaks=0, state=s)


def test_object_created_inside():
    def f(x):
        s = Scaler(1.0)
        y = s.apply(x)
        return y, s.calls, s.doubled
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_property_static_classmethod():
    def f(x):
        s = Scaler.make(3.0)
        return Scaler.square(x) + s.doubled, s.square(x), Scaler.factor
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_super_call():
    c = Child()
    def f(x):
        return c.forward(x)
    check(f, shapes((3,)), graphs=1, breaks=0, state=c)


@dynamo_bug("vars() of an object created in the frame comes back empty")
def test_super_object_created_inside():
    def f(x):
        c = Child()
        c.scale = 5
        return c.forward(x), vars(c)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_attribute_write_on_input_object():
    s = Scaler(0.0)
    def f(x):
        s.bias = x.sum()
        s.last = x * 2
        s.tag = "seen"
        return x + 1
    check(f, shapes((3,)), graphs=1, breaks=0, state=s)


def test_attribute_delete():
    s = Scaler(1.0)
    def f(x):
        s.tmp = x
        y = s.tmp * 3
        del s.tmp
        return y, hasattr(s, "tmp")
    check(f, shapes((3,)), graphs=1, breaks=0, state=s)


def test_class_attribute_read():
    def f(x):
        return x * Scaler.factor, x * Scaler(0).factor
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_getitem_len_call_protocols():
    seq = Seq([1.0, 2.0, 3.0])
    def f(x):
        return seq(x), x * len(seq), x + seq[1], 2.0 in seq, seq[-1]
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_operator_overloading_user_class():
    def f(x, y):
        v = Vec(x) + Vec(y) * 3
        return (-v).t
    check(f, shapes((3,), (3,)), graphs=1, breaks=0)


def test_dataclass_config():
    def f(x, cfg):
        y = x.relu() if cfg.act == "relu" else x.tanh()
        return y * cfg.scale + cfg.hidden
    check(f, lambda i: (T(4), Config(act=["relu", "tanh", "relu"][i], scale=2.0)), graphs=1, breaks=0)


def test_dataclass_created_and_returned():
    def f(x):
        c = Config(hidden=x.shape[0])
        c.scale = 3.0
        return x * c.scale, c, dataclasses.replace(c, act="gelu")
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_dataclass_with_tensors():
    def f(p):
        q = Pair(p.a * 2, p.b - 1)
        return q.total(), q
    check(f, lambda i: (Pair(T(2), T(2)),), graphs=1, breaks=0)


def test_dataclass_mutated_input():
    def f(p):
        p.a = p.a + p.b
        p.b.mul_(2)
        return p.total()
    check(f, lambda i: (Pair(T(2), T(2)),), graphs=1, breaks=0)


def test_namedtuple():
    def f(x):
        p = Point(x, x * 2)
        q = p._replace(y=p.y + 1)
        a, b = q
        return q, a + b, q.x * q[1], Point._fields
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_namedtuple_input_and_typing():
    def f(s):
        width = s.hi - s.lo
        return Span(s.lo, s.lo + width * 2, s.tag + "!"), len(s)
    check(f, lambda i: (Span(T(2), T(2)),), graphs=1, breaks=0)


def test_list_of_objects():
    objs = [Scaler(1.0), Scaler(2.0)]
    def f(x):
        for o in objs:
            x = o.apply(x)
        return x
    check(f, shapes((3,)), graphs=1, breaks=0, state=objs)


def test_object_holding_tensor_attribute():
    class Holder:
        def __init__(self):
            self.w = torch.randn(3)
    h = Holder()
    def f(x):
        return x * h.w
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_object_tensor_attribute_inplace():
    class Acc:
        def __init__(self):
            self.total = torch.zeros(3)
            self.n = 0
    acc = Acc()
    def f(x):
        acc.total.add_(x)
        acc.n += 1
        return acc.total / acc.n
    check(f, shapes((3,)), graphs=1, breaks=0, state=acc)


def test_class_defined_inside_function():
    def f(x):
        class Local:
            def __init__(self, v):
                self.v = v
            def get(self):
                return self.v * 2
        return Local(x).get()
    # Building a class inside the frame may be traced (dynamo: 1 graph) or break.
    check(f, shapes((3,)))


def test_bound_method_as_value():
    s = Scaler(1.0)
    def f(x):
        m = s.apply
        return m(x) + m(x)
    check(f, shapes((3,)), graphs=1, breaks=0, state=s)


def test_getattr_dynamic_name_on_object():
    c = Config(hidden=3, scale=0.5)
    def f(x, name):
        return x * getattr(c, name)
    check(f, lambda i: (T(3), ["hidden", "scale", "hidden"][i]), graphs=1, breaks=0)


def test_isinstance_user_classes():
    def f(x, obj):
        if isinstance(obj, Child):
            return obj.forward(x) + 100
        if isinstance(obj, Base):
            return obj.forward(x)
        return x
    check(f, lambda i: (T(3), [Base(), Child(), None][i]), graphs=1, breaks=0)


def test_dunder_iter_user_class():
    class Bag:
        def __init__(self, items):
            self.items = items
        def __iter__(self):
            return iter(self.items)
    bag = Bag([1, 2, 3])
    def f(x):
        return [x * k for k in bag], sum(bag)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_slots_class():
    class P:
        __slots__ = ("a", "b")
        def __init__(self, a, b):
            self.a = a
            self.b = b
    def f(x):
        p = P(x, 2)
        p.b = 3
        return p.a * p.b
    check(f, shapes((3,)), graphs=1, breaks=0)


class Temperature:
    def __init__(self, t):
        self._t = t

    @property
    def t(self):
        return self._t

    @t.setter
    def t(self, v):
        self._t = v * 2


def test_property_setter():
    def f(x):
        obj = Temperature(x)
        obj.t = obj.t + 1
        return obj.t
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_classmethod_via_instance_and_inheritance():
    class A:
        k = 2
        @classmethod
        def scale(cls, x):
            return x * cls.k
    class B(A):
        k = 5
    def f(x):
        return A.scale(x), B.scale(x), B().scale(x)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_method_mutating_list_attribute():
    class Stack:
        def __init__(self):
            self.items = []
        def push(self, v):
            self.items.append(v)
            return self
    st = Stack()
    def f(x):
        st.push(x * 2).push(x + 1)
        return sum(st.items), len(st.items)
    check(f, shapes((3,)), graphs=1, breaks=0, state=st)
