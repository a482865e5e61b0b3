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

PyMethodDef kMethods[] = {
    {"make_specs", reinterpret_cast<PyCFunction>(make_specs), METH_O, nullptr},
    {"check", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(check)),
     METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "kiln_native_guards", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_kiln_native_guards(void) { return PyModule_Create(&kModule); }
