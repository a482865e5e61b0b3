"""Every capture module that registers behaviour when imported: Value rules and classes
(``values.rules``, ``values.kinds``) and entries of the call tables (``rule_tables``).
Rule modules call one another through those registries rather than by import, which
keeps capture's imports one-way; this module, imported by ``tracer`` before any trace,
is what makes every registration present. A module that registers anything is listed
here (``tests/capture/test_capture_imports.py`` checks it). ``builtins`` comes before
the modules that override some of its entries (``max``/``min`` on tensors)."""
from kiln.capture import builtins  # noqa: F401  (first: the entries below override some of its)
from kiln.capture import (assumptions, autocast, builder, cached_functions, classes, cond,  # noqa: F401
                          containers, default_dicts, dict_views, func_transforms, function_attrs,
                          iterators, made_modules, modules, numpy_calls, numpy_rules, numpy_shapes,
                          numpy_ufuncs, numpy_values, objects, optimizers, output, stdlib_collections,
                          stdlib_itertools, sym_sizes, tensor_builtins, tensor_grads, torch_rules, weak_refs,
                          while_loop, wrap_numpy)
