"""``shapes/variants.SizeVariants``: the per-size compiled variants of one symbolic
graph, least recently used dropped beyond ``config.dynamic_specializations``, no compile
once a stream has cycled past the bound. (End to end: tests/autograd/test_specialize.py.)"""
import kiln
from kiln.shapes.variants import SizeVariants


def test_lru_drops_the_least_recently_used_and_stops_when_the_stream_cycles():
    t = SizeVariants()
    with kiln.config.patch(dynamic_specializations=3):
        for k in "abc":
            assert t.get(k) is None and t.admit()
            t.put(k, k.upper())
        assert t.get("a") == "A"                  # a is now the most recent
        assert t.admit() and "b" not in t         # full: b (least recent) dropped
        t.put("d", "D")
        assert list(t.table) == ["c", "a", "d"]
        for k in "be":                            # two more dropped: three in all
            assert t.admit()
            t.put(k, k.upper())
        assert t.evictions == 3 and len(t) == 3
        assert not t.admit() and t.thrashing      # a stream past the bound: no compile
        assert list(t.table) == ["d", "b", "e"]
        assert t.get("e") == "E"                  # the kept ones still serve
    assert (t.compiles, t.compiled_calls) == (6, 8)
