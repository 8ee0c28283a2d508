"""Verified Triton kernels that fusion-advisor can route chains to.

One module per kernel. Every module follows the contract checked by ``fusion-advisor verify`` and timed by
``fusion-advisor bench``:

- ``kernel_fn(*args)``: the public wrapper around the Triton kernel(s);
- ``reference_fn(*args)``: plain PyTorch with the same signature and semantics;
- ``get_inputs()``: a list of fresh argument tensors on the current device (realistic shapes on a GPU,
  small ones on the CPU where the kernels run under ``TRITON_INTERPRET=1``).

and the optional hooks ``verify`` reads (``fusion_advisor/kernel_tools/verify.py``): ``get_inputs(size)`` with ``SIZES`` (the
edge shapes are derived from the first size: one row, a partial last block, odd widths, many rows) or, where a
size is not ``(rows, width)``, ``VERIFY_SIZES`` (the extra sizes themselves); ``hard_inputs()`` returning
``[(label, args), ...]``, the hard values the kernel documents; ``USES_TF32 = True`` for fp32 ``tl.dot`` products.

Each module also registers itself in :mod:`kernel_library.registry`, which tells the router which chain
pattern the kernel replaces and under which constraints (dtypes, row width).
"""

from kernel_library.registry import KERNELS, KernelEntry, get_kernel, load_all

__all__ = ["KERNELS", "KernelEntry", "get_kernel", "load_all"]
