"""Pickling what a compile produced so that another process can find its objects again.

A traced entry or an aten graph names functions, classes, modules, torch operators and
module dicts. Pickled by value they would be copies, and by pickle's own reference
(module and qualified name) a function edited or patched since would come back as its
new self with nothing to say so. ``Saver`` writes each such object as a *reference*, a
small record of how to find it (``refs``), and ``resolve_refs`` finds them all again in
the loading process before ``Loader`` reads the rest:

- ("module", name), ("moddict", name): ``sys.modules`` (a module not loaded is stale);
- ("op", qualified name, overload): ``torch.ops``;
- ("global", module, qualname, fingerprint): a class, builtin or function; a Python
  function's fingerprint (its bytecode, constants, defaults and closure cells, see
  ``function_fingerprint``) must be the same, or the record is stale;
- kinds of the caller's own (``Saver.special`` / ``resolve_refs(special=...)``).

Plain values (numbers, strings, dtypes, devices, containers of them, enum members) are
pickled by value; anything else is ``Uncacheable`` unless the caller's ``fallback``
finds a way. Graphs (``graph_record`` / ``graph_from``) are node lists whose targets
go through the same references; meta tensors in node metadata are kept as their
storage (its size, shared by the tensors that shared it), sizes, strides, offset, dtype
and requires_grad.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import pickle
import sys
import types

import torch

_PLAIN = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis), slice, range,
          torch.dtype, torch.device, torch.memory_format, torch.layout, torch.Size)
_CONTAINERS = (tuple, list, dict, set, frozenset)
#: kiln's own record types, pickled by value
BY_VALUE_MODULES = {"kiln.capture.sources", "kiln.capture.guards", __name__}


class Uncacheable(Exception):
    """Why something cannot be stored."""


class Stale(Exception):
    """A record that does not apply to this process (a name gone, a function changed)."""


class NodeRef:
    """A graph node named in another node's arguments."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (NodeRef, (self.name,))


class MetaStorage:
    """A meta tensor's storage by its size: one object per storage in a record, so
    that tensors sharing a storage share it again when read back (the kernel compiler
    asks whether an output is its whole storage, and whether a view shares its root's)."""
    __slots__ = ("nbytes",)

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def __reduce__(self):
        return (_meta_storage, (self.nbytes,))


def _meta_storage(nbytes):
    return torch.UntypedStorage(nbytes, device="meta")


class MetaTensor:
    """A meta tensor of node metadata: its storage (``MetaStorage``), sizes, strides,
    offset, dtype and requires_grad."""
    __slots__ = ("storage", "size", "stride", "offset", "dtype", "requires_grad")

    def __init__(self, t, storages: dict):
        st = t.untyped_storage()
        self.storage = storages.get(st._cdata)
        if self.storage is None:
            self.storage = storages[st._cdata] = MetaStorage(st.nbytes())
        self.size, self.stride = tuple(t.shape), tuple(t.stride())
        self.offset, self.dtype, self.requires_grad = t.storage_offset(), t.dtype, t.requires_grad

    def __reduce__(self):
        return (_meta_tensor, (self.storage, self.size, self.stride, self.offset, self.dtype,
                               self.requires_grad))


def _meta_tensor(storage, size, stride, offset, dtype, requires_grad):
    t = torch.empty(0, dtype=dtype, device="meta").set_(storage, offset, size, stride)
    return t.requires_grad_(requires_grad) if requires_grad else t


# --- fingerprints ------------------------------------------------------------------------
def code_digest(code) -> str:
    h = hashlib.sha256()
    _hash_code(code, h)
    return h.hexdigest()


def _hash_code(code, h) -> None:
    """What a code object does (``marshal.dumps`` is not stable across processes: it
    marks objects by their reference counts)."""
    for part in (code.co_code, code.co_exceptiontable):
        h.update(len(part).to_bytes(4, "little") + part)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                   code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                   code.co_flags, code.co_name, getattr(code, "co_qualname", ""))).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            h.update(b"code:")
            _hash_code(c, h)
        else:
            h.update(f"{type(c).__qualname__}:{c!r};".encode())


def _plain_repr(v, seen, depth=0) -> str:
    if depth > 16:
        raise Uncacheable("a default or closure cell nested too deeply")
    if type(v) in (tuple, list):
        return f"{type(v).__name__}(" + ",".join(_plain_repr(x, seen, depth + 1) for x in v) + ")"
    if type(v) is dict:
        return "{" + ",".join(f"{_plain_repr(k, seen, depth + 1)}:{_plain_repr(x, seen, depth + 1)}"
                              for k, x in v.items()) + "}"
    if isinstance(v, _PLAIN) or isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}:{v!r}"
    if isinstance(v, types.FunctionType):
        return "fn:" + _fingerprint(v, seen, depth + 1)
    if isinstance(v, (type, types.BuiltinFunctionType, types.ModuleType)):
        return f"ref:{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', v.__name__)}"
    raise Uncacheable(f"a function's default or cell holds a {type(v).__qualname__}")


def function_fingerprint(fn) -> str:
    """The function's bytecode, constants, defaults and closure cells (functions there
    fingerprinted in turn): equal fingerprints, the same behaviour for the same globals."""
    return _fingerprint(fn, {}, 0)


def _fingerprint(fn, seen: dict, depth: int) -> str:
    if id(fn) in seen:                       # a closure that reaches itself
        return f"cycle:{seen[id(fn)]}"
    seen[id(fn)] = len(seen)
    h = hashlib.sha256()
    _hash_code(fn.__code__, h)
    h.update(_plain_repr(fn.__defaults__, seen, depth).encode())
    h.update(_plain_repr(fn.__kwdefaults__, seen, depth).encode())
    for cell in fn.__closure__ or ():
        try:
            h.update(_plain_repr(cell.cell_contents, seen, depth).encode())
        except ValueError:
            h.update(b"<empty cell>")
    h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
    return h.hexdigest()


# --- names -------------------------------------------------------------------------------
def by_name(obj):
    """(module, qualified name) that find ``obj`` again, or None: its own qualname, or
    its name in its module (``F.max_pool2d``, a ``<locals>`` function made at import)."""
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        return None
    for qual in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if not isinstance(qual, str) or "<" in qual:
            continue
        try:
            if resolve(mod, qual) is obj:
                return mod, qual
        except Exception:  # noqa: BLE001 -- not found: no name for it
            continue
    return None


def resolve(mod, qual):
    m = sys.modules[mod]
    for part in qual.split("."):
        m = getattr(m, part)
    return m


def module_dict_name(d) -> str | None:
    """The ``sys.modules`` key of the module whose globals ``d`` is, or None."""
    name = d.get("__name__") if isinstance(d.get("__name__", None), str) else None
    if name is None:
        return None
    if getattr(sys.modules.get(name), "__dict__", None) is d:
        return name
    # a module that renames itself (_collections_abc is "collections.abc")
    for key, m in list(sys.modules.items()):
        if getattr(m, "__dict__", None) is d:
            return key
    return None


# --- writing -----------------------------------------------------------------------------
class Saver(pickle.Pickler):
    """Pickles with references into ``refs`` (shared by several savers through
    ``share``). ``allow_tensors``: tensors by value (a graph's constants); meta tensors
    are always kept by geometry."""

    def __init__(self, f, allow_tensors=False):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs: list = []
        self.ref_ids: dict = {}
        self._keep: list = []
        self.allow_tensors = allow_tensors

    def share(self, other: "Saver") -> "Saver":
        self.refs, self.ref_ids, self._keep = other.refs, other.ref_ids, other._keep
        return self

    def ref(self, obj, spec):
        i = self.ref_ids.get(id(obj))
        if i is None:
            i = self.ref_ids[id(obj)] = len(self.refs)
            self.refs.append(spec)
            self._keep.append(obj)
        return ("ref", i)

    # hooks
    def special(self, obj):
        """A reference of the caller's own kind, or None."""
        return None

    def fallback(self, obj, fp=None):
        """An object with no name: Uncacheable unless the caller knows better."""
        what = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        raise Uncacheable(f"{what} has no name to find it by")

    def identity_matters(self, obj) -> bool:
        """A mutable container compared by identity (the caller's): not by value."""
        return False

    def persistent_id(self, obj):
        t = type(obj)
        if t in _PLAIN or t is NodeRef or t is MetaTensor or t is MetaStorage:
            return None
        i = self.ref_ids.get(id(obj))     # met before (alive: ``_keep`` holds it)
        if i is not None:
            return ("ref", i)
        own = self.special(obj)
        if own is not None:
            return own
        if t is dict:
            name = module_dict_name(obj)
            if name is not None:
                return self.ref(obj, ("moddict", name))
        if t in _CONTAINERS:
            if t is not tuple and self.identity_matters(obj):
                return self.fallback(obj)
            return None
        if t is types.ModuleType:
            if sys.modules.get(obj.__name__) is not obj:
                raise Uncacheable(f"module {obj.__name__} is not the one sys.modules names")
            return self.ref(obj, ("module", obj.__name__))
        if t is types.CellType:
            raise Uncacheable("a closure cell")
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "meta" and type(obj) is torch.Tensor:
                return None if self.allow_tensors else self.fallback(obj)
            if self.allow_tensors:      # a graph's constant: its value is what it means
                return None
            return self.fallback(obj)
        if isinstance(obj, torch._ops.OpOverload):
            return self.ref(obj, ("op", obj._schema.name, obj._overloadname))
        if isinstance(obj, torch._ops.OpOverloadPacket):
            return self.ref(obj, ("op", obj._qualified_op_name, None))
        if t is types.FunctionType:
            fp = function_fingerprint(obj)
            named = by_name(obj)
            if named is not None:
                return self.ref(obj, ("global", *named, fp))
            return self.fallback(obj, fp)
        if isinstance(obj, type) or t in (types.BuiltinFunctionType, types.BuiltinMethodType) \
                or t.__name__ in ("wrapper_descriptor", "method_descriptor", "getset_descriptor"):
            named = by_name(obj)
            if named is not None:
                return self.ref(obj, ("global", *named, None))
            self_ = getattr(obj, "__self__", None)
            for mod in (getattr(self_, "__name__", None) if isinstance(self_, types.ModuleType) else None,
                        getattr(obj, "__module__", None)):
                # torch.relu: its qualname is _VariableFunctionsClass.relu, found as torch.relu
                if isinstance(mod, str) and mod in sys.modules and \
                        getattr(sys.modules[mod], obj.__name__, None) is obj:
                    return self.ref(obj, ("global", mod, obj.__name__, None))
            return self.fallback(obj)
        if t is functools.partial or isinstance(obj, enum.Enum) \
                or t.__module__ == "torch.fx.immutable_collections":   # a node's arguments
            return None
        if t.__module__ in BY_VALUE_MODULES:
            return None
        return self.fallback(obj)


def dump(saver_type, obj, **kw) -> tuple[bytes, Saver]:
    """``obj`` pickled by a fresh ``saver_type``: (bytes, the saver with its refs)."""
    import io
    f = io.BytesIO()
    s = saver_type(f, **kw)
    s.dump(obj)
    return f.getvalue(), s


# --- reading -----------------------------------------------------------------------------
class Loader(pickle.Unpickler):
    def __init__(self, f, objs):
        super().__init__(f)
        self.objs = objs

    def persistent_load(self, pid):
        return self.objs[pid[1]]


def load(data: bytes, objs):
    import io
    return Loader(io.BytesIO(data), objs).load()


def resolve_refs(refs, special=None) -> list:
    """Every reference found again; Stale when one is not as it was. ``special(spec)``
    resolves the caller's own kinds (NotImplemented: not one of them)."""
    out = [None] * len(refs)
    for i, spec in enumerate(refs):
        kind = spec[0]
        try:
            got = special(i, spec) if special is not None else NotImplemented
            if got is not NotImplemented:
                out[i] = got
            elif kind == "moddict":
                out[i] = sys.modules[spec[1]].__dict__
            elif kind == "module":
                out[i] = sys.modules[spec[1]]
            elif kind == "op":
                packet = resolve("torch", "ops." + spec[1].replace("::", "."))
                out[i] = packet if spec[2] is None else getattr(packet, spec[2] or "default")
            elif kind == "global":
                obj = resolve(spec[1], spec[2])
                check_fingerprint(obj, spec[3])
                out[i] = obj
            else:
                raise Stale(f"unknown reference {kind}")
        except Stale:
            raise
        except Exception as e:  # noqa: BLE001 -- a name gone: the record does not apply
            raise Stale(f"{spec[:3]}: {type(e).__name__}: {e}") from None
    return out


def check_fingerprint(obj, fp):
    if fp is None:
        return
    if type(obj) is not types.FunctionType:
        raise Stale("a function is now something else")
    try:
        now = function_fingerprint(obj)
    except Uncacheable as e:
        raise Stale(str(e)) from None
    if now != fp:
        raise Stale(f"{obj.__qualname__} changed")


# --- graphs ------------------------------------------------------------------------------
def graph_record(graph, attrs_of=None, meta_keys=None) -> dict:
    """An fx.Graph's nodes as (op, name, target, args, kwargs, meta); ``attrs_of``: the
    module its get_attr nodes read (their values kept by value); ``meta_keys``: the
    node metadata kept (None: all; meta tensors, alone or in tuples, by geometry and
    storage)."""
    import torch.fx as fx
    nodes, attrs, storages = [], {}, {}

    def ref(a):
        return NodeRef(a.name)

    def by_geometry(v, k):
        if isinstance(v, torch.Tensor):
            if v.device.type != "meta" or type(v) is not torch.Tensor:
                raise Uncacheable(f"node metadata {k} holds a {type(v).__qualname__} on {v.device}")
            return MetaTensor(v, storages)
        if type(v) in (tuple, list):
            return type(v)(by_geometry(x, k) for x in v)
        return v

    for n in graph.nodes:
        meta = {}
        for k, v in n.meta.items():
            if meta_keys is not None and k not in meta_keys:
                continue
            meta[k] = by_geometry(v, k)
        nodes.append((n.op, n.name, n.target, fx.node.map_arg(n.args, ref),
                      fx.node.map_arg(n.kwargs, ref), meta))
        if n.op == "get_attr" and attrs_of is not None:
            v = attrs_of
            for a in n.target.split("."):
                v = getattr(v, a)
            attrs[n.target] = v
    return {"nodes": nodes, "attrs": attrs}


def graph_from(record):
    """The fx.Graph of ``graph_record`` (its get_attr values in ``record["attrs"]``)."""
    import torch.fx as fx
    graph = fx.Graph()
    env = {}

    def node_of(a):
        return env[a.name] if type(a) is NodeRef else a

    for op, name, target, args, kwargs, meta in record["nodes"]:
        n = graph.create_node(op, target, fx.node.map_aggregate(args, node_of),
                              fx.node.map_aggregate(kwargs, node_of), name=name)
        n.meta.update(meta)
        env[name] = n
    return graph


def module_with(attrs: dict):
    """An nn.Module holding ``attrs`` (dotted names) for a GraphModule to copy from."""
    root = torch.nn.Module()
    for target, value in attrs.items():
        *path, last = target.split(".")
        owner = root
        for p in path:
            if not hasattr(owner, p):
                owner.add_module(p, torch.nn.Module())
            owner = getattr(owner, p)
        setattr(owner, last, value)
    return root
