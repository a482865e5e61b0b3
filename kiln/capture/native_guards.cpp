// kiln's tensor guards in C++ (built and loaded by native_guards.py).
//
// An entry's guards check every input tensor's type, dtype, device, sizes, strides and
// requires_grad. In Python each tensor costs about half a microsecond (each attribute
// read makes a Python object: a torch.Size, a stride tuple, a device); here the same
// facts are read from the TensorImpl, a few nanoseconds a tensor. The Python guards stay
// the reference: they explain a failure, and they run where this library is missing.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <vector>

namespace {

constexpr const char* kCapsule = "kiln.native_guards.specs";

// What one tensor must be: exactly `type`, strided, with these facts. requires_grad is
// -1 where the Python guard on it is not a plain `is True/False` (left to Python).
struct Spec {
  PyObject* type;
  c10::ScalarType dtype;
  c10::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int requires_grad;
};

struct Specs {
  std::vector<Spec> items;
  ~Specs() {
    for (auto& s : items) Py_XDECREF(s.type);
  }
};

void free_specs(PyObject* capsule) {
  delete static_cast<Specs*>(PyCapsule_GetPointer(capsule, kCapsule));
}

bool read_ints(PyObject* tuple, std::vector<int64_t>& out) {
  if (!PyTuple_Check(tuple)) {
    PyErr_SetString(PyExc_TypeError, "sizes and strides must be tuples of ints");
    return false;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return false;
    out[i] = v;
  }
  return true;
}

// make_specs([(type, dtype, device, sizes, strides, requires_grad or None), ...])
PyObject* make_specs(PyObject*, PyObject* list) {
  if (!PyList_Check(list)) {
    PyErr_SetString(PyExc_TypeError, "make_specs takes a list of tuples");
    return nullptr;
  }
  auto specs = new Specs();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    PyObject *type, *dtype, *device, *sizes, *strides, *rg;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "OOOOOO", &type, &dtype, &device,
                          &sizes, &strides, &rg)) {
      delete specs;
      return nullptr;
    }
    if (!PyType_Check(type) || !THPDtype_Check(dtype) || !THPDevice_Check(device)) {
      delete specs;
      PyErr_SetString(PyExc_TypeError, "a spec is (type, torch.dtype, torch.device, ...)");
      return nullptr;
    }
    Spec s{type, reinterpret_cast<THPDtype*>(dtype)->scalar_type,
           reinterpret_cast<THPDevice*>(device)->device, {}, {},
           rg == Py_None ? -1 : PyObject_IsTrue(rg)};
    Py_INCREF(type);
    specs->items.push_back(std::move(s));
    if (!read_ints(sizes, specs->items.back().sizes) ||
        !read_ints(strides, specs->items.back().strides)) {
      delete specs;
      return nullptr;
    }
  }
  return PyCapsule_New(specs, kCapsule, free_specs);
}

bool matches(const Spec& s, PyObject* obj) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != s.type) return false;
  const at::TensorBase& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.layout() != c10::kStrided || t.is_nested()) return false;
  if (t.scalar_type() != s.dtype || t.device() != s.device) return false;
  if (s.requires_grad >= 0 && t.requires_grad() != (s.requires_grad == 1)) return false;
  return t.sizes().equals(s.sizes) && t.strides().equals(s.strides);
}

// check(specs, tensors) -> bool: every tensor matches its spec.
PyObject* check(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "check(specs, tensors)");
    return nullptr;
  }
  auto specs = static_cast<Specs*>(PyCapsule_GetPointer(args[0], kCapsule));
  if (specs == nullptr) return nullptr;
  PyObject* tensors = args[1];
  if (!PyTuple_Check(tensors) ||
      static_cast<size_t>(PyTuple_GET_SIZE(tensors)) != specs->items.size())
    Py_RETURN_FALSE;
  try {
    for (size_t i = 0; i < specs->items.size(); ++i)
      if (!matches(specs->items[i], PyTuple_GET_ITEM(tensors, i))) Py_RETURN_FALSE;
  } catch (...) {  // symbolic sizes, a tensor without storage...: not the traced one
    Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// --- guard programs ----------------------------------------------------------------
// A run of an entry's guards over access paths (guard_program.py): each path is a step
// from a root (an argument of the entry, or an object the entry holds) or from another
// path: an attribute, an item, or a call with no arguments. Each guard is a conjunction
// of checks on one path's value. Paths are read at their first use and then kept, as the
// Python chain keeps them in locals (guard_cse.py); guards run in order and stop at the
// first that fails. An exception is a failure, as in the chain's `except Exception`.

constexpr const char* kProgram = "kiln.native_guards.program";

enum StepKind { ROOT_ARG = 0, ROOT_OBJ = 1, ATTR = 2, ITEM = 3, CALL0 = 4 };
enum CheckOp {
  TYPE_IS = 0,     // type(v) is a
  IS = 1,          // v is a
  EQ = 2,          // v == a
  TYPED_EQ = 3,    // type(v) is a and v == b
  IS_OR_CALL = 4,  // v is a or b(v, a)
  CALL = 5,        // b(v, a)
  TYPED_CALL = 6,  // type(v) is a and b[0](v, b[1])
  LEN = 7,         // len(v) == a
  KEYS = 8,        // tuple(v) == a
  KEYS_CALL = 9,   // b(tuple(v), a)
  FALSY = 10,      // not v
};

struct Step {
  int kind;
  int parent;     // the path it reads from (ATTR, ITEM, CALL0); an argument's index (ROOT_ARG)
  PyObject* key;  // the name, the item's key, or the root object
  // ATTR: the last type seen, at its version, for which `obj.key` is the instance dict's
  // entry when it has one (see instance_attr)
  PyTypeObject* seen_type = nullptr;
  unsigned int seen_version = 0;
};

struct Check {
  int path;
  int op;
  PyObject* a;
  PyObject* b;
};

struct Program {
  std::vector<Step> steps;
  std::vector<Check> checks;
  std::vector<int> guard_ends;  // guard g is checks [guard_ends[g-1], guard_ends[g])
  ~Program() {
    for (auto& s : steps) Py_XDECREF(s.key);
    for (auto& c : checks) {
      Py_XDECREF(c.a);
      Py_XDECREF(c.b);
    }
  }
};

void free_program(PyObject* capsule) {
  delete static_cast<Program*>(PyCapsule_GetPointer(capsule, kProgram));
}

// make_program(steps, checks, guard_ends): steps [(kind, parent, key)], checks
// [(path, op, a, b)], guard_ends [int]; indices are checked here, once.
PyObject* make_program(PyObject*, PyObject* args) {
  PyObject *steps, *checks, *ends;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &steps, &PyList_Type, &checks,
                        &PyList_Type, &ends))
    return nullptr;
  auto prog = new Program();
  auto fail = [&](const char* why) -> PyObject* {
    delete prog;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, why);
    return nullptr;
  };
  Py_ssize_t n_steps = PyList_GET_SIZE(steps);
  for (Py_ssize_t i = 0; i < n_steps; ++i) {
    int kind, parent;
    PyObject* key;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(steps, i), "iiO", &kind, &parent, &key))
      return fail("bad step");
    if (kind < ROOT_ARG || kind > CALL0) return fail("bad step kind");
    if (kind >= ATTR && (parent < 0 || parent >= i)) return fail("a step reads a later path");
    if (kind == ATTR && !PyUnicode_Check(key)) return fail("an attribute name is a str");
    Py_INCREF(key);
    prog->steps.push_back({kind, parent, key});
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(checks); ++i) {
    int path, op;
    PyObject *a, *b;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(checks, i), "iiOO", &path, &op, &a, &b))
      return fail("bad check");
    if (path < 0 || path >= n_steps || op < TYPE_IS || op > FALSY) return fail("bad check");
    if (op == TYPED_CALL && !(PyTuple_Check(b) && PyTuple_GET_SIZE(b) == 2))
      return fail("TYPED_CALL takes (function, value)");
    Py_INCREF(a);
    Py_INCREF(b);
    prog->checks.push_back({path, op, a, b});
  }
  int last = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ends); ++i) {
    long e = PyLong_AsLong(PyList_GET_ITEM(ends, i));
    if (e == -1 && PyErr_Occurred()) return fail("bad guard end");
    if (e <= last || e > static_cast<long>(prog->checks.size())) return fail("bad guard end");
    prog->guard_ends.push_back(static_cast<int>(e));
    last = static_cast<int>(e);
  }
  if (last != static_cast<int>(prog->checks.size())) return fail("checks outside a guard");
  return PyCapsule_New(prog, kProgram, free_program);
}

// 1: holds, 0: does not, -1: an exception that must propagate (not an Exception).
int truth(PyObject* r) {
  if (r == nullptr) return -1;
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  return t;
}

int equal(PyObject* v, PyObject* a) { return truth(PyObject_RichCompare(v, a, Py_EQ)); }

int call2(PyObject* fn, PyObject* v, PyObject* a) {
  return truth(PyObject_CallFunctionObjArgs(fn, v, a, nullptr));
}

int check_one(const Check& c, PyObject* v) {
  switch (c.op) {
    case TYPE_IS: return reinterpret_cast<PyObject*>(Py_TYPE(v)) == c.a;
    case IS: return v == c.a;
    case EQ: return equal(v, c.a);
    case TYPED_EQ:
      if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != c.a) return 0;
      return equal(v, c.b);
    case IS_OR_CALL:
      if (v == c.a) return 1;
      return call2(c.b, v, c.a);
    case CALL: return call2(c.b, v, c.a);
    case TYPED_CALL:
      if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != c.a) return 0;
      return call2(PyTuple_GET_ITEM(c.b, 0), v, PyTuple_GET_ITEM(c.b, 1));
    case LEN: {
      Py_ssize_t n = PyObject_Length(v);
      if (n < 0) return -1;
      return n == PyLong_AsSsize_t(c.a);
    }
    case KEYS:
    case KEYS_CALL: {
      PyObject* t = PySequence_Tuple(v);
      if (t == nullptr) return -1;
      int r = c.op == KEYS ? equal(t, c.a) : call2(c.b, t, c.a);
      Py_DECREF(t);
      return r;
    }
    case FALSY: {
      int t = PyObject_IsTrue(v);
      return t < 0 ? -1 : !t;
    }
  }
  return 0;
}

PyObject* getattribute_name() {
  static PyObject* name = PyUnicode_InternFromString("__getattribute__");   // kept
  return name;
}

// object.__getattribute__, as a class finds it in its MRO when no class overrides it
PyObject* object_getattribute() {
  static PyObject* found = _PyType_Lookup(&PyBaseObject_Type, getattribute_name());
  return found;
}

// `obj.name` read as Python reads it, faster for an instance attribute: where the
// object's type (at the version of it last seen here) inherits object.__getattribute__
// and has no attribute of that name anywhere in its MRO, Python's lookup finds the
// instance dict's entry if there is one (else __getattr__, if the class has one); so the
// dict is read directly. A type changed since (a property added, __getattribute__
// assigned) has another version tag and takes the full lookup again. nn.Module defines
// __getattr__, so each full lookup walks the MRO three times.
PyObject* instance_attr(Step& s, PyObject* obj) {
  PyTypeObject* tp = Py_TYPE(obj);
  bool tagged = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG);
  if (tagged && tp == s.seen_type && tp->tp_version_tag == s.seen_version) {
    PyObject* dict = PyObject_GenericGetDict(obj, nullptr);
    if (dict != nullptr) {
      PyObject* v = PyDict_CheckExact(dict) ? PyDict_GetItemWithError(dict, s.key) : nullptr;
      Py_XINCREF(v);
      Py_DECREF(dict);
      if (v != nullptr) return v;
    }
    if (PyErr_Occurred()) return nullptr;
    return PyObject_GetAttr(obj, s.key);       // not in the dict: __getattr__'s answer
  }
  PyObject* v = PyObject_GetAttr(obj, s.key);
  if (v != nullptr && tagged && tp->tp_dictoffset != 0 &&
      _PyType_Lookup(tp, getattribute_name()) == object_getattribute() &&
      _PyType_Lookup(tp, s.key) == nullptr && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
    s.seen_type = tp;
    s.seen_version = tp->tp_version_tag;
  }
  return v;
}

// The value of path i: a borrowed reference into vals (read, with its parents, at its
// first use), or nullptr with an exception set.
PyObject* path_value(Program& prog, PyObject** vals, PyObject* roots, int i) {
  if (vals[i] != nullptr) return vals[i];
  Step& s = prog.steps[i];
  PyObject* v = nullptr;
  if (s.kind == ROOT_ARG) {
    if (s.parent >= PyTuple_GET_SIZE(roots)) {
      PyErr_SetString(PyExc_IndexError, "guard program: missing argument");
      return nullptr;
    }
    v = PyTuple_GET_ITEM(roots, s.parent);
    Py_INCREF(v);
  } else if (s.kind == ROOT_OBJ) {
    v = s.key;
    Py_INCREF(v);
  } else {
    PyObject* base = path_value(prog, vals, roots, s.parent);
    if (base == nullptr) return nullptr;
    if (s.kind == ATTR) v = instance_attr(s, base);
    else if (s.kind == ITEM) v = PyObject_GetItem(base, s.key);
    else v = PyObject_CallNoArgs(base);
  }
  vals[i] = v;
  return v;
}

// run_program(program, args) -> bool
PyObject* run_program(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "run_program(program, args: tuple)");
    return nullptr;
  }
  auto prog = static_cast<Program*>(PyCapsule_GetPointer(args[0], kProgram));
  if (prog == nullptr) return nullptr;
  const size_t n = prog->steps.size();
  PyObject* small[128];
  std::vector<PyObject*> big;
  PyObject** vals = small;
  if (n > 128) {
    big.assign(n, nullptr);
    vals = big.data();
  } else {
    std::fill(small, small + n, nullptr);
  }
  int result = 1;
  size_t c = 0;
  for (size_t g = 0; g < prog->guard_ends.size() && result == 1; ++g) {
    for (; c < static_cast<size_t>(prog->guard_ends[g]); ++c) {
      const Check& ch = prog->checks[c];
      PyObject* v = path_value(*prog, vals, args[1], ch.path);
      int r = v == nullptr ? -1 : check_one(ch, v);
      if (r != 1) {
        result = r;
        break;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) Py_XDECREF(vals[i]);
  if (result == -1) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // KeyboardInterrupt...
    PyErr_Clear();
    result = 0;
  }
  if (result == 1) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyMethodDef kMethods[] = {
    {"make_specs", reinterpret_cast<PyCFunction>(make_specs), METH_O, nullptr},
    {"check", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(check)),
     METH_FASTCALL, nullptr},
    {"make_program", reinterpret_cast<PyCFunction>(make_program), METH_VARARGS, nullptr},
    {"run_program",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(run_program)),
     METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "kiln_native_guards", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_kiln_native_guards(void) { return PyModule_Create(&kModule); }
