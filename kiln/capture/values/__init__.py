"""Symbolic values: what the interpreter keeps on its stack and in its locals.

A handful of small classes by family (one file each, importing only the files above it
in this list): ``base`` (Value, NULL, the ``rules`` and ``kinds`` registries),
``constants`` (and exceptions), ``tensors`` (an FX node plus a fake tensor), ``objects``
(classes, user objects, context managers), ``containers``, ``functions``, ``modules``.
Each value knows its *source* (where it came from, for guards and for rebuilding it at
run time) and the behaviour of the Python type it stands for; behaviour that needs the
layers above (wrapping, torch's op rules, inlining) is registered in ``rules`` by the
rule modules. Callers use the package as one namespace: ``from kiln.capture import
values as V``; ``V.TensorValue``.
"""
from kiln.capture.values.base import (NULL, LazyArg, NullValue, Value, is_mutable, kind,  # noqa: F401
                                      kinds, rule, rules)
from kiln.capture.values.constants import C, ConstantValue, ExceptionValue, is_none  # noqa: F401
from kiln.capture.values.tensors import SymIntValue, SymSliceValue, TensorValue  # noqa: F401
from kiln.capture.values.objects import (DELETED, AutogradFunctionApply, ClassValue, ContextValue,  # noqa: F401
                                         ExitValue, GradModeValue, NewObjectValue, ObjectValue,
                                         SuperValue, _defined_by_torch, _GradModeWrapped)
from kiln.capture.values.containers import (BoundContainerMethod, DictValue, IteratorValue,  # noqa: F401
                                            ListValue, NamedTupleValue, SetValue, TupleValue,
                                            _container_getattr, _Sequence)
from kiln.capture.values.functions import (BuiltinValue, CellValue, FunctionValue,  # noqa: F401
                                           MethodValue, NestedFunctionValue, PartialValue,
                                           TorchFunctionValue, UserFunctionValue, _AllowedFunction,
                                           _BreakingFunction, _CallableRef, _FunctionGet,
                                           _GradModeFactory)
from kiln.capture.values.modules import ModuleValue, PythonModuleValue  # noqa: F401
