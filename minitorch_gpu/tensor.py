"""Tensor: one array of a backend, plus what autograd needs (grad, requires_grad, grad_fn).

Shapes, strides and views follow PyTorch: ``transpose``/``permute``/``expand``/slicing
return views of the same memory, ``view`` refuses strides it cannot express, ``reshape``
copies only when it must. Strides are reported in elements, as ``torch.Tensor.stride()``.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from .backend import Backend, Device, cpu, dtypes, get_backend

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

    # --- copying and pickling ------------------------------------------------------------
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

    # --- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: Any) -> "Tensor":
        return _ops.add(self, other)

    def __radd__(self, other: Any) -> "Tensor":
        return _ops.add(other, self)

    def __sub__(self, other: Any) -> "Tensor":
        return _ops.sub(self, other)

    def __rsub__(self, other: Any) -> "Tensor":
        return _ops.sub(other, self)

    def __mul__(self, other: Any) -> "Tensor":
        return _ops.mul(self, other)

    def __rmul__(self, other: Any) -> "Tensor":
        return _ops.mul(other, self)

    def __truediv__(self, other: Any) -> "Tensor":
        return _ops.div(self, other)

    def __rtruediv__(self, other: Any) -> "Tensor":
        return _ops.div(other, self)

    def __floordiv__(self, other: Any) -> "Tensor":
        return _ops.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> "Tensor":
        return _ops.floor_divide(other, self)

    def __mod__(self, other: Any) -> "Tensor":
        return _ops.remainder(self, other)

    def __rmod__(self, other: Any) -> "Tensor":
        return _ops.remainder(other, self)

    def __pow__(self, other: Any) -> "Tensor":
        return _ops.pow(self, other)

    def __rpow__(self, other: Any) -> "Tensor":
        return _ops.pow(other, self)

    def __matmul__(self, other: Any) -> "Tensor":
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return _ops.matmul(other, self)

    def __neg__(self) -> "Tensor":
        return _ops.neg(self)

    def __abs__(self) -> "Tensor":
        return _ops.abs(self)

    def __eq__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return _ops.eq(self, other)

    def __ne__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return _ops.ne(self, other)

    def __lt__(self, other: Any) -> "Tensor":
        return _ops.lt(self, other)

    def __le__(self, other: Any) -> "Tensor":
        return _ops.le(self, other)

    def __gt__(self, other: Any) -> "Tensor":
        return _ops.gt(self, other)

    def __ge__(self, other: Any) -> "Tensor":
        return _ops.ge(self, other)

    def __and__(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(self, other)

    def __or__(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(self, other)

    def __invert__(self) -> "Tensor":
        return _ops.bitwise_not(self)

    def __xor__(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(self, other)

    def __rand__(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(other, self)

    def __ror__(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(other, self)

    def __rxor__(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(other, self)

    # --- in-place updates (refused on tensors that require grad while grad is on) --------
    def __iadd__(self, other: Any) -> "Tensor":
        return self.add_(other)

    def __isub__(self, other: Any) -> "Tensor":
        return self.sub_(other)

    def __imul__(self, other: Any) -> "Tensor":
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> "Tensor":
        return self.div_(other)

    def add_(self, other: Any, alpha: Any = 1) -> "Tensor":
        value = _inplace_operand(self, other, "add_")
        if alpha != 1:
            value = value * alpha
        value = _wrapped_int(value, self)
        self.data += value
        return self._bump()

    def sub_(self, other: Any, alpha: Any = 1) -> "Tensor":
        value = _inplace_operand(self, other, "sub_")
        if alpha != 1:
            value = value * alpha
        value = _wrapped_int(value, self)
        self.data -= value
        return self._bump()

    def mul_(self, other: Any) -> "Tensor":
        self.data *= _wrapped_int(_inplace_operand(self, other, "mul_"), self)
        return self._bump()

    def div_(self, other: Any) -> "Tensor":
        self.data /= _inplace_operand(self, other, "div_")
        return self._bump()

    def copy_(self, src: Any) -> "Tensor":
        value = _inplace_operand(self, src, "copy_")
        self.data[...] = value
        return self._bump()

    def fill_(self, value: Any) -> "Tensor":
        _inplace_operand(self, value, "fill_")
        self.data.fill(value)
        return self._bump()

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def clamp_(self, min: Any = None, max: Any = None) -> "Tensor":
        _inplace_operand(self, 0, "clamp_")
        self._backend.xp.clip(self.data, min, max, out=self.data)
        return self._bump()

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> "Tensor":
        """Fill with samples of N(mean, std^2) from the backend's seeded generator."""
        _inplace_operand(self, 0, "normal_")
        self.data[...] = self._backend.randn(self.shape, self.dtype) * std + mean
        return self._bump()

    def uniform_(self, low: float = 0.0, high: float = 1.0) -> "Tensor":
        """Fill with samples of U(low, high) from the backend's seeded generator."""
        _inplace_operand(self, 0, "uniform_")
        self.data[...] = self._backend.rand(self.shape, self.dtype) * (high - low) + low
        return self._bump()

    def __setitem__(self, key: Any, value: Any) -> None:
        value = _inplace_operand(self, value, "setitem")
        target, key = _ops.indexing.setitem_target(self.data, _ops.index_key(key, self))
        target[key] = value
        self._bump()

    def _bump(self) -> "Tensor":
        self._version[0] += 1
        return self

    # --- elementwise and reductions, as methods ----------------------------------------
    def add(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return _ops.add(self, _scaled(other, alpha))

    def sub(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return _ops.sub(self, _scaled(other, alpha))

    def mul(self, other: Any) -> "Tensor":
        return _ops.mul(self, other)

    multiply = mul
    subtract = sub

    def neg(self) -> "Tensor":
        return _ops.neg(self)

    negative = neg

    def where(self, condition: Any, other: Any) -> "Tensor":
        """``self`` where ``condition`` is true, else ``other`` (torch's argument order)."""
        return _ops.where(condition, self, other)

    def eq(self, other: Any) -> "Tensor":
        return _ops.eq(self, other)

    def ne(self, other: Any) -> "Tensor":
        return _ops.ne(self, other)

    def lt(self, other: Any) -> "Tensor":
        return _ops.lt(self, other)

    def le(self, other: Any) -> "Tensor":
        return _ops.le(self, other)

    def gt(self, other: Any) -> "Tensor":
        return _ops.gt(self, other)

    def ge(self, other: Any) -> "Tensor":
        return _ops.ge(self, other)

    def logical_and(self, other: Any) -> "Tensor":
        return _ops.logical_and(self, other)

    def logical_or(self, other: Any) -> "Tensor":
        return _ops.logical_or(self, other)

    def logical_not(self) -> "Tensor":
        return _ops.logical_not(self)

    def bitwise_and(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(self, other)

    def bitwise_or(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(self, other)

    def bitwise_xor(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(self, other)

    def bitwise_not(self) -> "Tensor":
        return _ops.bitwise_not(self)

    def multinomial(self, num_samples: int, replacement: bool = False) -> "Tensor":
        return _ops.multinomial(self, num_samples, replacement)

    # PyTorch's other names for the ops above, and small compositions of them
    def divide(self, other: Any, *, rounding_mode: Optional[str] = None) -> "Tensor":
        return self.div(other, rounding_mode=rounding_mode)

    def true_divide(self, other: Any) -> "Tensor":
        return self.div(other)

    def absolute(self) -> "Tensor":
        return self.abs()

    greater, less, not_equal = gt, lt, ne
    greater_equal, less_equal = ge, le

    def square(self) -> "Tensor":
        return _ops.mul(self, self)

    def clamp_min(self, min: Any) -> "Tensor":  # noqa: A002 - torch's name
        return _ops.clamp(self, min, None)

    def clamp_max(self, max: Any) -> "Tensor":  # noqa: A002 - torch's name
        return _ops.clamp(self, None, max)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    def is_floating_point(self) -> bool:
        return dtypes.is_floating(self.dtype)

    def is_signed(self) -> bool:
        return self.dtype.kind in "fi" or self.dtype == dtypes.bfloat16

    def ndimension(self) -> int:
        return self.data.ndim

    nelement = numel

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

    def swapaxes(self, axis0: int, axis1: int) -> "Tensor":
        return _ops.transpose(self, axis0, axis1)

    swapdims = swapaxes

    def movedim(self, source: Any, destination: Any) -> "Tensor":
        """Move dims ``source`` to positions ``destination`` (ints or sequences): a view."""
        src = [_wrap_dim(d, self.ndim, "movedim") for d in
               (source if isinstance(source, (tuple, list)) else (source,))]
        dst = [_wrap_dim(d, self.ndim, "movedim") for d in
               (destination if isinstance(destination, (tuple, list)) else (destination,))]
        if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise ValueError(f"movedim: source {source} and destination {destination} must "
                             "be as many distinct dims")
        rest = iter(d for d in range(self.ndim) if d not in src)
        placed = dict(zip(dst, src))
        return _ops.permute(self, tuple(placed[i] if i in placed else next(rest)
                                        for i in range(self.ndim)))

    moveaxis = movedim

    def unbind(self, dim: int = 0) -> tuple:
        """The slices along ``dim``, each without it (views)."""
        d = _wrap_dim(dim, self.ndim, "unbind")
        return tuple(self[(slice(None),) * d + (i,)] for i in range(self.shape[d]))

    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        """The entries ``index`` (1-D integers) along ``dim``: a copy."""
        if not isinstance(index, Tensor) or index.ndim > 1 or index.dtype.kind not in "iu":
            raise TypeError("index_select: index must be a 0-d or 1-D integer tensor")
        d = _wrap_dim(dim, self.ndim, "index_select")
        return self[(slice(None),) * d + (index.reshape(-1),)]

    def mm(self, other: "Tensor") -> "Tensor":
        if self.ndim != 2 or getattr(other, "ndim", 0) != 2:
            raise ValueError("mm: expected two 2-D tensors")
        return _ops.matmul(self, other)

    def bmm(self, other: "Tensor") -> "Tensor":
        if self.ndim != 3 or getattr(other, "ndim", 0) != 3:
            raise ValueError("bmm: expected two 3-D tensors")
        return _ops.matmul(self, other)

    def mv(self, vec: "Tensor") -> "Tensor":
        if self.ndim != 2 or getattr(vec, "ndim", 0) != 1:
            raise ValueError("mv: expected a 2-D tensor and a 1-D tensor")
        return _ops.matmul(self, vec)

    def dot(self, other: "Tensor") -> "Tensor":
        if self.ndim != 1 or getattr(other, "ndim", 0) != 1:
            raise ValueError("dot: expected two 1-D tensors")
        return _ops.matmul(self, other)

    def outer(self, other: "Tensor") -> "Tensor":
        return _ops.mul(self.reshape(-1, 1), other.reshape(1, -1))

    def allclose(self, other: "Tensor", rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> bool:
        other = other.data if isinstance(other, Tensor) else other
        return bool(self._backend.xp.allclose(self.data, other, rtol=rtol, atol=atol,
                                              equal_nan=equal_nan))

    def equal(self, other: "Tensor") -> bool:
        """Same shape and the same values (torch.equal)."""
        return self.shape == other.shape and bool(self._backend.xp.array_equal(self.data,
                                                                               other.data))

    def exp(self) -> "Tensor":
        return _ops.exp(self)

    def log(self) -> "Tensor":
        return _ops.log(self)

    def sqrt(self) -> "Tensor":
        return _ops.sqrt(self)

    def sin(self) -> "Tensor":
        return _ops.sin(self)

    def cos(self) -> "Tensor":
        return _ops.cos(self)

    # elementwise math (ops/elementwise_math.py, ops/rounding.py)
    def rsqrt(self) -> "Tensor":
        return _ops.rsqrt(self)

    def erf(self) -> "Tensor":
        return _ops.erf(self)

    def exp2(self) -> "Tensor":
        return _ops.exp2(self)

    def log2(self) -> "Tensor":
        return _ops.log2(self)

    def log10(self) -> "Tensor":
        return _ops.log10(self)

    def tan(self) -> "Tensor":
        return _ops.tan(self)

    def asin(self) -> "Tensor":
        return _ops.asin(self)

    def acos(self) -> "Tensor":
        return _ops.acos(self)

    def atan(self) -> "Tensor":
        return _ops.atan(self)

    def sinh(self) -> "Tensor":
        return _ops.sinh(self)

    def cosh(self) -> "Tensor":
        return _ops.cosh(self)

    def asinh(self) -> "Tensor":
        return _ops.asinh(self)

    def acosh(self) -> "Tensor":
        return _ops.acosh(self)

    def atanh(self) -> "Tensor":
        return _ops.atanh(self)

    def atan2(self, other: Any) -> "Tensor":
        return _ops.atan2(self, other)

    def logaddexp(self, other: Any) -> "Tensor":
        return _ops.logaddexp(self, other)

    def lerp(self, end: Any, weight: Any) -> "Tensor":
        return _ops.lerp(self, end, weight)

    def floor(self) -> "Tensor":
        return _ops.floor(self)

    def ceil(self) -> "Tensor":
        return _ops.ceil(self)

    def round(self, *, decimals: int = 0) -> "Tensor":
        return _ops.round(self, decimals=decimals)

    def trunc(self) -> "Tensor":
        return _ops.trunc(self)

    def sign(self) -> "Tensor":
        return _ops.sign(self)

    def div(self, other: Any, *, rounding_mode: Optional[str] = None) -> "Tensor":
        return _ops.div(self, other, rounding_mode=rounding_mode)

    def floor_divide(self, other: Any) -> "Tensor":
        return _ops.floor_divide(self, other)

    def remainder(self, other: Any) -> "Tensor":
        return _ops.remainder(self, other)

    def fmod(self, other: Any) -> "Tensor":
        return _ops.fmod(self, other)

    def isnan(self) -> "Tensor":
        return _ops.isnan(self)

    def isinf(self) -> "Tensor":
        return _ops.isinf(self)

    def isfinite(self) -> "Tensor":
        return _ops.isfinite(self)

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> "Tensor":
        return _ops.isclose(self, other, rtol, atol, equal_nan)

    def tril(self, diagonal: int = 0) -> "Tensor":
        return _ops.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> "Tensor":
        return _ops.triu(self, diagonal)

    def tanh(self) -> "Tensor":
        return _ops.tanh(self)

    def sigmoid(self) -> "Tensor":
        return _ops.sigmoid(self)

    def relu(self) -> "Tensor":
        return _ops.relu(self)

    def abs(self) -> "Tensor":
        return _ops.abs(self)

    def pow(self, exponent: Any) -> "Tensor":
        return _ops.pow(self, exponent)

    def clamp(self, min: Any = None, max: Any = None) -> "Tensor":
        return _ops.clamp(self, min, max)

    clip = clamp

    def maximum(self, other: Any) -> "Tensor":
        return _ops.maximum(self, other)

    def minimum(self, other: Any) -> "Tensor":
        return _ops.minimum(self, other)

    def masked_fill(self, mask: Any, value: float) -> "Tensor":
        return _ops.masked_fill(self, mask, value)

    def sum(self, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> "Tensor":
        return _ops.sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> "Tensor":
        return _ops.mean(self, dim, keepdim, dtype=dtype)

    def var(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
            *, correction: Optional[int] = None) -> "Tensor":
        return _ops.var(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)

    def std(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
            *, correction: Optional[int] = None) -> "Tensor":
        return _ops.std(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)

    def amax(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.amax(self, dim, keepdim)

    def amin(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.amin(self, dim, keepdim)

    def max(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:
        return _ops.max(self, dim, keepdim)

    def min(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:
        return _ops.min(self, dim, keepdim)

    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return _ops.argmax(self, dim, keepdim)

    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return _ops.argmin(self, dim, keepdim)

    def cumsum(self, dim: int, *, dtype: Any = None) -> "Tensor":
        return _ops.cumsum(self, dim, dtype=dtype)

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
        return _ops.sort(self, dim, descending, stable)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
        return _ops.topk(self, k, dim, largest, sorted)

    def any(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.any(self, dim, keepdim)

    def all(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.all(self, dim, keepdim)

    def softmax(self, dim: int) -> "Tensor":
        return _ops.softmax(self, dim)

    def log_softmax(self, dim: int) -> "Tensor":
        return _ops.log_softmax(self, dim)

    def matmul(self, other: Any) -> "Tensor":
        return _ops.matmul(self, other)

    # --- shape and views ----------------------------------------------------------------
    def view(self, *shape: Any) -> "Tensor":
        """``view(2, 3)``, ``view((2, 3))``, or ``view(dtype)``: the same bytes read as
        another dtype (the last dim scaled by the ratio of the itemsizes, as PyTorch)."""
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
            return _ops.views.view_dtype(self, shape[0])
        return _ops.view(self, _shape_args(shape))

    def view_as(self, other: "Tensor") -> "Tensor":
        return _ops.view(self, other.shape)

    def reshape(self, *shape: Any) -> "Tensor":
        return _ops.reshape(self, _shape_args(shape))

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return _ops.reshape(self, other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        return _ops.flatten(self, start_dim, end_dim)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        return _ops.transpose(self, dim0, dim1)

    def t(self) -> "Tensor":
        if self.ndim > 2:
            raise ValueError(f"t: expected a tensor of at most 2 dims, got {self.ndim}; "
                             "use transpose(dim0, dim1) or mT")
        return self if self.ndim < 2 else _ops.transpose(self, 0, 1)

    @property
    def T(self) -> "Tensor":
        """All dims reversed (a view)."""
        return _ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        """The last two dims swapped (a view): the batched matrix transpose."""
        if self.ndim < 2:
            raise ValueError(f"mT: expected at least 2 dims, got shape {tuple(self.shape)}")
        return _ops.transpose(self, -2, -1)

    def permute(self, *dims: Any) -> "Tensor":
        return _ops.permute(self, _shape_args(dims))

    def unsqueeze(self, dim: int) -> "Tensor":
        return _ops.unsqueeze(self, dim)

    def squeeze(self, dim: Any = None) -> "Tensor":
        return _ops.squeeze(self, dim)

    def expand(self, *shape: Any) -> "Tensor":
        return _ops.expand(self, _shape_args(shape))

    def expand_as(self, other: "Tensor") -> "Tensor":
        return _ops.expand(self, other.shape)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        return _ops.narrow(self, dim, start, length)

    def split(self, split_size: Any, dim: int = 0) -> tuple:
        return _ops.split(self, split_size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        return _ops.chunk(self, chunks, dim)

    def __getitem__(self, key: Any) -> "Tensor":
        return _ops.getitem(self, key)

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        return _ops.gather(self, dim, index)

    # --- reductions, scans, rearranging and scattering (ops/reduce.py, ops/rearrange.py) --
    def logsumexp(self, dim: Any, keepdim: bool = False) -> "Tensor":
        return _ops.logsumexp(self, dim, keepdim)

    def prod(self, dim: Optional[int] = None, keepdim: bool = False, *,
             dtype: Any = None) -> "Tensor":
        return _ops.prod(self, dim, keepdim, dtype=dtype)

    def cumprod(self, dim: int, *, dtype: Any = None) -> "Tensor":
        return _ops.cumprod(self, dim, dtype=dtype)

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> "Tensor":
        return _ops.argsort(self, dim, descending, stable)

    def repeat(self, *sizes: Any) -> "Tensor":
        return _ops.repeat(self, *sizes)

    def repeat_interleave(self, repeats: Any, dim: Optional[int] = None, *,
                          output_size: Optional[int] = None) -> "Tensor":
        return _ops.repeat_interleave(self, repeats, dim, output_size=output_size)

    def flip(self, *dims: Any) -> "Tensor":
        return _ops.flip(self, _shape_args(dims))

    def roll(self, shifts: Any, dims: Any = None) -> "Tensor":
        return _ops.roll(self, shifts, dims)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> "Tensor":
        return _ops.unflatten(self, dim, sizes)

    def scatter(self, dim: int, index: "Tensor", src: Any = None, *, value: Any = None,
                reduce: Optional[str] = None) -> "Tensor":
        return _ops.scatter(self, dim, index, src, value=value, reduce=reduce)

    def scatter_add(self, dim: int, index: "Tensor", src: "Tensor") -> "Tensor":
        return _ops.scatter_add(self, dim, index, src)

    def scatter_reduce(self, dim: int, index: "Tensor", src: "Tensor", reduce: str, *,
                       include_self: bool = True) -> "Tensor":
        return _ops.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)

    def masked_select(self, mask: "Tensor") -> "Tensor":
        return _ops.masked_select(self, mask)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        return _ops.nonzero(self, as_tuple=as_tuple)


# --- helpers ------------------------------------------------------------------------------
# PyTorch's tensor type names (``Tensor.type()``), by dtype name
_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
               "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
               "bool": "BoolTensor"}


def _wrapped_int(value: Any, target: Tensor) -> Any:
    """A Python int wrapped into an integer ``target``'s dtype, as PyTorch's in-place
    arithmetic does (``int32_tensor += 2**32`` adds 0), where NumPy raises."""
    if type(value) is int and target.data.dtype.kind in "iu":
        return _ops.promotion.wrap_int(value, target.data.dtype)
    return value


def _scaled(other: Any, alpha: Any) -> Any:
    """``alpha * other`` for ``add``/``sub``'s ``alpha=`` (a number stays a number)."""
    if alpha == 1:
        return other
    return _ops.mul(other, alpha) if isinstance(other, Tensor) else other * alpha


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


def _inplace_operand(target: Tensor, value: Any, op: str) -> Any:
    """Check an in-place update is allowed, and return ``value`` as something xp accepts."""
    if autograd.is_grad_enabled():
        if target.requires_grad:
            what = "a leaf tensor" if target.is_leaf else "a tensor"
            raise RuntimeError(
                f"{op}: in-place update of {what} that requires grad; do it under "
                "no_grad() (e.g. an optimizer step) or use the out-of-place op")
        if isinstance(value, Tensor) and value.requires_grad:
            raise RuntimeError(f"{op}: the value requires grad but in-place updates are not "
                               "recorded by autograd; use the out-of-place op")
    if isinstance(value, Tensor):
        if value._backend is not target._backend:
            raise RuntimeError(f"{op}: the value is on {value.device}, the tensor on "
                               f"{target.device}")
        return value.data
    return value


from . import autograd  # noqa: E402  (autograd builds on Tensor)
from . import ops as _ops  # noqa: E402  (the ops build on Tensor and autograd)

# every method with a dim/keepdim parameter also takes axis=/keepdims=, as in PyTorch
for _name, _method in list(vars(Tensor).items()):
    if callable(_method) and not _name.startswith("_"):
        setattr(Tensor, _name, _ops._util.accept_numpy_names(_method))
