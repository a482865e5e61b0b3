"""The decomposition table rebuilt from a remembered op list (``decomp_table.py``) and
the core op set as a membership test (``ops.CORE_OPS``): the same ops as PyTorch's
own table and tags give, without resolving every op at start-up."""
import torch
from torch._decomp import core_aten_decompositions

from kiln import config
from kiln.autograd import decomp_table, ops

aten = torch.ops.aten


def test_remembered_table_matches_pytorchs(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    full = decomp_table.core_aten_table()            # builds and remembers
    remembered = decomp_table.core_aten_table()      # from the op list
    assert remembered._names and not full._names
    probe = [aten.silu.default, aten.linear.default, aten.addcmul.default,
             aten.mm.default, aten.add.Tensor]
    assert [op in remembered for op in probe] == [op in full for op in probe]
    assert remembered._all is None                  # lookups resolved nothing
    expected = dict(core_aten_decompositions())
    assert set(remembered) == set(expected) == set(full)
    for op, fn in expected.items():                 # each remembered entry: the op's own
        got = remembered[op]
        assert got is fn or got == op.decompose, op
    remembered.pop(aten.linear.default)
    assert aten.linear.default not in remembered and aten.linear.default not in set(remembered)


def test_core_ops_membership():
    listed = set(ops.CORE_OPS)
    assert aten.convolution.default in listed and aten.add.Tensor in listed
    assert aten.add_.Tensor not in ops.CORE_OPS               # mutation
    assert aten.linear.default not in ops.CORE_OPS            # decomposed by the tracer
    some = [getattr(getattr(aten, n), "default", None) for n in
            ("relu", "sum", "exp", "silu", "native_layer_norm", "addmm", "t", "clone")]
    assert all((op in ops.CORE_OPS) == (op in listed) for op in some if op is not None)
    wider = ops.CORE_OPS | {aten.linear.default}
    assert aten.linear.default in wider and aten.add.Tensor in wider


def test_a_bad_op_list_is_a_miss(tmp_path, monkeypatch):
    """The remembered list is a checked cache entry: a garbage file, a truncated one, a
    bare list of names (not sealed) or another entry in its place is not read as the
    list (a wrong list would decompose ops it should not, or miss some); the table is
    built again and the entry replaced."""
    from kiln import disk_cache
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    decomp_table.core_aten_table()
    (path,) = disk_cache.locations("decompositions", decomp_table._key(), ".txt")
    good = open(path, "rb").read()
    other = disk_cache.seal("decompositions", "0" * 32, b"aten::mm.default")
    for bad in (b"aten::mm.default\naten::add.Tensor", good[:-7], b"\xff\x00garbage",
                other, good.replace(b"aten::linear.default", b"aten::mm.defaultXXXXX")):
        with open(path, "wb") as f:
            f.write(bad)
        before = disk_cache.stats["rejected"]
        table = decomp_table.core_aten_table()
        assert not table._names, bad[:40]              # built, not read
        assert aten.mm.default not in table and aten.linear.default in table
        assert disk_cache.stats["rejected"] == before + 1
        assert open(path, "rb").read() == good         # replaced
