"""Tensor: one array of a backend, plus what autograd needs (grad, requires_grad, grad_fn).

Shapes, strides and views follow PyTorch: ``transpose``/``permute``/``expand``/slicing
return views of the same memory, ``view`` refuses strides it cannot express, ``reshape``
copies only when it must. Strides are reported in elements, as ``torch.Tensor.stride()``.

This file holds the core: storage, shape and strides, conversions and device moves, grad
and backward, repr. The methods that forward to the ops are families of their own,
copied onto Tensor at the end of this file: ``tensor_math.py`` (operators, elementwise
math, reductions), ``tensor_shape.py`` (views, indexing, rearranging copies) and
``tensor_inplace.py`` (``+=``, ``add_`` ... ``t[key] = v``).
"""
from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from .backend import Backend, Device, cpu, dtypes, get_backend

# capturing.py's recorder while a function is being captured (Tensor._make, _bump and
# numpy() tell it what happens outside an op); None otherwise, one test per tensor
_capture_hook: Any = None

Shape = tuple


class Tensor:
    """An n-dimensional array on a device, recorded in the autograd graph when it needs grad.

    Make tensors with the factories (``minitorch_gpu.tensor``, ``zeros``, ``randn``, ...)
    rather than this class. ``data`` is the raw backend array (NumPy or CuPy).
    """

    __slots__ = ("data", "requires_grad", "grad", "grad_fn", "_backend", "_version",
                 "_accumulator", "__weakref__")

    def __new__(cls, data: Any, requires_grad: bool = False,
                device: Union[str, Device, None] = None, dtype: Any = None) -> "Tensor":
        if _capture_hook is not None:  # a copy would freeze a captured value
            _capture_hook.copied(data)
        backend = get_backend(device) if device is not None else _backend_for(data)
        array = backend.asarray(data.data if isinstance(data, Tensor) else data,
                                dtype=None if dtype is None else dtypes.as_dtype(dtype))
        t = cls._make(array, backend, False)
        if requires_grad:
            t.requires_grad_()
        return t

    @classmethod
    def _make(cls, array: Any, backend: Backend, requires_grad: bool) -> "Tensor":
        """Wrap an array without checks or copies (the fast path every op result takes)."""
        t = object.__new__(cls)
        t.data = array
        t.requires_grad = requires_grad
        t.grad = None
        t.grad_fn = None
        t._backend = backend
        t._version = [0]  # shared by views; bumped by in-place ops
        t._accumulator = None  # the AccumulateGrad node of a leaf, made on first use
        if _capture_hook is not None:  # capturing.py's, while a function is being captured
            _capture_hook.made(t)
        return t

    # --- metadata -----------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return self.data.shape

    def size(self, dim: Optional[int] = None) -> Union[Shape, int]:
        return self.data.shape if dim is None else self.data.shape[_wrap_dim(dim, self.ndim, "size")]

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def dim(self) -> int:
        return self.data.ndim

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> Device:
        return self._backend.device

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def is_cuda(self) -> bool:
        return self._backend.device.type == "cuda"

    def element_size(self) -> int:
        return self.data.itemsize

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def stride(self, dim: Optional[int] = None) -> Union[Shape, int]:
        """Strides in elements (NumPy counts bytes; PyTorch counts elements)."""
        itemsize = self.data.itemsize
        strides = tuple(s // itemsize for s in self.data.strides)
        return strides if dim is None else strides[_wrap_dim(dim, self.ndim, "stride")]

    def is_contiguous(self) -> bool:
        """True when the elements lie in row-major order with no gaps (size-1 dims ignored)."""
        return bool(self.data.flags.c_contiguous)

    def data_ptr(self) -> int:
        """Address of the first element; a view of a tensor points into the same memory."""
        return self._backend.data_ptr(self.data)

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def is_floating_point(self) -> bool:
        return dtypes.is_floating(self.dtype)

    def is_signed(self) -> bool:
        return self.dtype.kind in "fi" or self.dtype == dtypes.bfloat16

    def ndimension(self) -> int:
        return self.data.ndim

    nelement = numel

    # --- conversions --------------------------------------------------------------------
    def item(self) -> Union[int, float, bool]:
        """The one value as a Python number. Like ``tolist``, ``float()``, ``int()`` and
        ``bool()`` (which call it), it reads the value back through ``backend.to_numpy``:
        on a GPU that waits for every queued kernel, and every read is counted in
        ``backend.host_reads``, so a hot loop should keep its values on the device."""
        if self.data.size != 1:
            raise ValueError(f"item: only a one-element tensor converts to a Python number, "
                             f"got shape {tuple(self.shape)}")
        return self._backend.to_numpy(self.data).item()

    def tolist(self) -> Any:
        return self._backend.to_numpy(self.data).tolist()

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (shared memory on the CPU, as in PyTorch)."""
        if self.requires_grad:
            raise RuntimeError("numpy: can't call numpy() on a tensor that requires grad; "
                               "use tensor.detach().numpy()")
        if self.is_cuda:
            raise TypeError(f"numpy: the tensor is on {self.device}; use tensor.cpu().numpy()")
        if _capture_hook is not None:  # a host read, though the memory is shared
            _capture_hook.host_read(self._backend)
        return self.data

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        array = self._backend.to_numpy(self.data)
        return array if dtype is None else array.astype(dtype, copy=False)

    def to(self, *args: Any, dtype: Any = None, device: Any = None) -> "Tensor":
        """``to("cuda")``, ``to(float64)``, ``to("cpu", float32)``; differentiable, no copy if
        nothing changes."""
        for arg in args:
            if isinstance(arg, (str, Device)) and not _is_dtype_name(arg):
                device = arg
            else:
                dtype = arg
        out = self
        if device is not None and get_backend(device) is not self._backend:
            out = _ops.to_device(out, device)
        if dtype is not None and dtypes.as_dtype(dtype) != out.dtype:
            out = _ops.to_dtype(out, dtype)
        return out

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def float(self) -> "Tensor":
        return self.to(dtypes.float32)

    def double(self) -> "Tensor":
        return self.to(dtypes.float64)

    def bfloat16(self) -> "Tensor":
        return self.to(dtypes.bfloat16)

    def half(self) -> "Tensor":
        return self.to(dtypes.float16)

    def long(self) -> "Tensor":
        return self.to(dtypes.int64)

    def int(self) -> "Tensor":
        return self.to(dtypes.int32)

    def bool(self) -> "Tensor":
        return self.to(dtypes.bool_)

    def type(self, dtype: Any = None) -> Any:
        """Without ``dtype``, PyTorch's name of the tensor's type ('torch.FloatTensor',
        'torch.cuda.LongTensor'), so code comparing those strings runs unchanged; with one
        (a dtype, or such a name), the tensor cast to it, as ``to(dtype)``."""
        if dtype is None:
            name = _TYPE_NAMES.get(self.dtype.name, self.dtype.name)
            return f"torch.{'cuda.' if self.is_cuda else ''}{name}"
        if isinstance(dtype, str) and dtype.startswith("torch."):
            by_type = {n: d for d, n in _TYPE_NAMES.items()}
            short = dtype.rsplit(".", 1)[-1]
            if short not in by_type:
                raise ValueError(f"type: unknown type {dtype!r}: expected one of "
                                 f"{sorted('torch.' + n for n in by_type)}")
            dtype = by_type[short]
        return self.to(dtype)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    def detach(self) -> "Tensor":
        """The same memory, cut out of the graph (shares the version counter)."""
        out = Tensor._make(self.data, self._backend, False)
        out._version = self._version
        return out

    def clone(self) -> "Tensor":
        return _ops.clone(self)

    def contiguous(self) -> "Tensor":
        """Self when already contiguous, else a row-major copy."""
        return self if self.is_contiguous() else _ops.contiguous(self)

    def set_(self, source: "Tensor") -> "Tensor":
        """Make this tensor hold ``source``'s array (and device), keeping its own identity:
        how ``Module.to`` moves a parameter while the optimizer and tied modules still hold
        the same object. Like any in-place update of a leaf that requires grad, only under
        ``no_grad()``."""
        if not isinstance(source, Tensor):
            raise TypeError(f"set_: expected a Tensor, got {type(source).__name__}")
        if autograd.is_grad_enabled() and self.requires_grad:
            raise RuntimeError("set_: in-place update of a tensor that requires grad; do it "
                               "under no_grad()")
        if self.requires_grad and not dtypes.is_floating(source.dtype):
            raise RuntimeError(f"set_: a tensor that requires grad must stay floating-point, "
                               f"got {source.dtype}")
        self.data = source.data
        self._backend = source._backend
        self._version = [self._version[0] + 1]  # new storage: views of the old one part ways
        self._accumulator = None  # its graph node knew the old dtype and shape
        return self

    def _bump(self) -> "Tensor":
        if _capture_hook is not None:  # an in-place update outside an op: refused there
            _capture_hook.updated(self)
        self._version[0] += 1
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if not self.is_leaf:
            raise RuntimeError("requires_grad_: only leaf tensors can change requires_grad; "
                               "use detach() to make a new leaf")
        if requires_grad and not dtypes.is_floating(self.dtype):
            raise RuntimeError(f"requires_grad_: only floating-point tensors can require "
                               f"grad, got {self.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor after backward (leaves always keep it)."""
        if self.grad_fn is not None:
            self.grad_fn.retained = weakref.ref(self)
        elif not self.requires_grad:
            raise RuntimeError("retain_grad: the tensor does not require grad")

    # --- copying and pickling -----------------------------------------------------------
    def __deepcopy__(self, memo: dict) -> "Tensor":
        """A leaf with its own copy of the data (and of ``.grad``), as torch's deepcopy."""
        if not self.is_leaf:
            raise RuntimeError("deepcopy: only leaf tensors can be deep-copied; detach() the "
                               "tensor first")
        out = type(self)._make(self.data.copy(), self._backend, self.requires_grad)
        if self.grad is not None:
            out.grad = Tensor._make(self.grad.data.copy(), self._backend, False)
        memo[id(self)] = out
        return out

    def __reduce__(self) -> tuple:
        """Pickle as (NumPy data, device, requires_grad); the graph is not pickled."""
        if not self.is_leaf:
            raise RuntimeError("pickle: only leaf tensors can be pickled; detach() the tensor "
                               "first")
        return (_rebuild, (self._backend.to_numpy(self.data), str(self.device),
                           self.requires_grad, type(self)))

    # --- autograd -----------------------------------------------------------------------
    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Accumulate gradients of this tensor into every leaf that requires grad."""
        autograd.backward(self, gradient, retain_graph)

    # --- printing -----------------------------------------------------------------------
    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self._backend.to_numpy(self.data)), separator=", ",
                               prefix="tensor(", threshold=200)
        extras = []
        if self.device.type != "cpu":
            extras.append(f"device='{self.device}'")
        if self.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_):
            extras.append(f"dtype={self.dtype}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn={self.grad_fn!r}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body, *extras]) + ")"

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.data.size} elements "
                               "is ambiguous; use .any() or .all()")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if dtypes.is_integer(self.dtype) and self.data.size == 1:
            return int(self.item())
        raise TypeError("only integer tensors of one element can be used as an index")

    __hash__ = object.__hash__
    # NumPy defers to our reflected operators: np.float64(2) * t is a Tensor (in the graph),
    # not an ndarray made through __array__
    __array_ufunc__ = None

    def __iter__(self) -> Iterator["Tensor"]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.data.shape[0]))

    # --- new tensors like this one ------------------------------------------------------
    def new_tensor(self, data: Any, dtype: Any = None) -> "Tensor":
        """A new leaf holding ``data``, with this tensor's dtype and device by default."""
        return Tensor(data, device=self.device, dtype=self.dtype if dtype is None else dtype)

    def new_full(self, size: Any, fill_value: Any, dtype: Any = None) -> "Tensor":
        dtype = self.dtype if dtype is None else dtypes.as_dtype(dtype)
        array = self._backend.xp.full(_shape_args((size,)) if isinstance(size, int)
                                      else _shape_args(size), fill_value, dtype=dtype)
        return Tensor._make(array, self._backend, False)

    def new_zeros(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_shape_args(size), 0, dtype)

    def new_ones(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_shape_args(size), 1, dtype)

    def new_empty(self, *size: Any, dtype: Any = None) -> "Tensor":
        return self.new_full(_shape_args(size), 0, dtype)


# --- helpers ------------------------------------------------------------------------------
# PyTorch's tensor type names (``Tensor.type()``), by dtype name
_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
               "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
               "bool": "BoolTensor"}


def _rebuild(array: np.ndarray, device: str, requires_grad: bool, cls: type = Tensor) -> Tensor:
    """Unpickle a tensor, or a subclass such as ``nn.Parameter`` (see ``Tensor.__reduce__``)."""
    backend = get_backend(device)
    return cls._make(backend.asarray(array), backend, requires_grad)


def _backend_for(data: Any) -> Backend:
    if isinstance(data, Tensor):
        return data._backend
    if hasattr(data, "__cuda_array_interface__"):
        return get_backend(Device("cuda", data.device.id))
    return cpu


def _is_dtype_name(arg: Any) -> bool:
    if not isinstance(arg, str):
        return False
    try:
        dtypes.as_dtype(arg)
    except ValueError:
        return False
    return True


def _wrap_dim(dim: int, ndim: int, op: str) -> int:
    """``dim`` in [0, ndim), counting negatives from the end; clear error when out of range."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {ndim} dims "
                         f"(expected -{bound} <= dim < {bound})")
    return dim + bound if dim < 0 else dim


def _shape_args(args: Sequence[Any]) -> tuple:
    """``view(2, 3)`` and ``view((2, 3))`` both mean the shape (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return tuple(int(a) for a in args)


def attach_methods(family: type) -> None:
    """Copy a family of Tensor methods, written as a class body in its own file, onto
    ``Tensor``, where they are plain class attributes (as fast as methods written here).
    Tensor cannot inherit them instead: they call the ops, which import Tensor."""
    for name, value in vars(family).items():
        # (a class body that defines __eq__ gets __hash__ = None: Tensor keeps its own)
        if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                        "__hash__"):
            setattr(Tensor, name, value)


from . import autograd  # noqa: E402  (autograd builds on Tensor)
from . import ops as _ops  # noqa: E402  (the ops build on Tensor and autograd)
from .tensor_inplace import TensorInplace  # noqa: E402  (the method families call the ops)
from .tensor_math import TensorMath  # noqa: E402
from .tensor_shape import TensorShape  # noqa: E402

for _family in (TensorMath, TensorShape, TensorInplace):
    attach_methods(_family)

# every method with a dim/keepdim parameter also takes axis=/keepdims=, as in PyTorch
for _name, _method in list(vars(Tensor).items()):
    if callable(_method) and not _name.startswith("_"):
        setattr(Tensor, _name, _ops._util.accept_numpy_names(_method))
