"""The capture test corpus: 200+ small Python programs, each compiled and compared
with eager PyTorch.

Every test calls ``harness.check(fn, make_inputs, graphs=..., breaks=...)``, which runs
the program eagerly and compiled on deep copies of fresh inputs (and of the mutable
state it touches), compares outputs, mutated inputs and state, and asserts the number
of graphs compiled by the first call and the number of graph breaks reported by
``explain``. Files are grouped by topic (tensors, views/indexing, Python values, calls,
objects, control flow, graph breaks, nn.Module).

Modes, chosen by the environment variable ``KILN_CORPUS_ORACLE``:

* unset (default): the programs are compiled with ``kiln.compile`` and counted with
  ``kiln.explain`` -- this is what holds kiln's capture front end to account.
* ``KILN_CORPUS_ORACLE=torch``: the programs are compiled with ``torch.compile`` and
  counted with ``torch._dynamo.explain``.  This validates the corpus itself (the eager
  references, the graph and break counts) against dynamo; the whole corpus passes in
  this mode::

      KILN_CORPUS_ORACLE=torch .venv/bin/python -m pytest tests/capture/programs -q

The expected graph/break counts were taken from dynamo (torch 2.14) on the first input
set and written in as literals; where dynamo's number is a dynamo quirk rather than
what a careful implementation would produce, the test leaves ``graphs``/``breaks`` as
``None`` and says why (a test may also skip a count in torch mode only, via
``harness.KILN_ONLY``).

Known dynamo bugs the corpus exposes (wrong results against eager) are marked with
``harness.dynamo_bug``: strict expected failures in torch mode only, ordinary tests for
kiln.  ``test_harness.py`` runs the checker against deliberately wrong fake compilers so
that every kind of check is known to be able to fail.

State the program mutates is given as ``state=``: live lists, dicts, sets, tensors,
modules (state_dict and plain attributes such as counters) and plain objects are
snapshotted, restored in place between the eager and the compiled run, and compared;
module-level names rebound with ``global`` go through ``harness.Globals``.
``backward=True`` also compares gradients of arguments and module parameters.

The test modules carry ``PYTEST_DONT_REWRITE`` in their docstrings so that pytest's
assertion rewriting leaves the programs' own ``assert`` statements as plain bytecode.
"""
