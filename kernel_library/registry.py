"""Registry of library kernels: what each replaces, and under which constraints.

Kernel modules call :func:`register_kernel` at import time; :func:`load_all` imports every module of the
package so the registry is complete. The router (``fusion_advisor.analyze.route``) looks kernels up by the chain
*pattern* they replace (``"rmsnorm"``, ``"softmax"``, ...), the names produced by ``fusion_advisor.analyze.chains``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

import torch

#: Chain patterns that ``fusion_advisor.analyze.chains`` recognises; a kernel must replace one of them.
KNOWN_PATTERNS = (
    "rmsnorm",
    "add_rmsnorm",
    "layernorm",
    "add_layernorm",
    "softmax",
    "masked_softmax",
    "cross_entropy",
    "linear_cross_entropy",
    "swiglu",
    "geglu",
    "bias_gelu",
    "rope",
    "gemm_epilogue",
    "matmul",  # the analysis' heavy GEMM item (its category), for kernels that replace a GEMM itself
)


@dataclass(frozen=True)
class KernelEntry:
    """One library kernel and the chain it can replace.

    Attributes:
        name: short unique name, also the module name in ``kernel_library`` (``"rmsnorm"``).
        module: dotted module path that holds the contract (``kernel_fn``, ``reference_fn``, ``get_inputs``).
        replaces: the chain pattern this kernel implements (one of :data:`KNOWN_PATTERNS`); default ``name``.
        op: the ``torch.library`` op name (``"fusion_advisor::rms_norm"``), or ``""`` if none.
        description: one line saying what the kernel computes and which reference op it matches.
        dtypes: floating dtypes the kernel supports.
        max_row_elems: widest row (last-dim elements) the kernel handles, ``None`` for no limit.
        has_backward: whether the op registers an autograd backward.
        pattern: plain-PyTorch function of the subgraph the kernel replaces (used by ``apply``), or ``None``.
        replacement: function with the pattern's signature that calls the kernel, or ``None``.
        example_args: small example arguments of ``pattern``, one per parameter, that ``apply`` traces it on (only
            the graph's structure matters; the exact pass retraces at the model's shapes): a tuple of ints is a
            tensor of that shape in the float dtype being traced (fp32 and bf16), ``(shape, dtype)`` a tensor of
            that dtype (``((6,), torch.int64)`` for targets), ``"scalar"`` a scalar parameter such as ``eps``
            (traced with a sentinel, captured from the model at a match).
        extra_check: predicate over the matched arguments (tensors' shapes, dtypes; the pattern's parameters in
            order), or ``None``: ``True`` to take the site, ``False`` to refuse it, or a string, the reason it is
            refused (``""`` to take it), which apply's near-miss report quotes.
        match_dtypes: the float dtypes ``apply`` matches the pattern in at all, or ``None`` for any: a site in
            another dtype is not this kernel's (no near-miss), e.g. an fp32-only GEMM meeting a bf16 ``F.linear``,
            which is cuBLAS's tensor-core GEMM already.
        heavy_targets: for a kernel that replaces a heavy op, the aten ops of the analysis' item it is meant for
            (``("addmm", "mm")`` for ``F.linear``, ``("bmm",)`` for batched products): where several kernels
            replace the same pattern, the router takes the one whose targets the item has first.
    """

    name: str
    module: str
    replaces: str = ""
    op: str = ""
    description: str = ""
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    max_row_elems: int | None = None
    has_backward: bool = False
    pattern: Callable | None = field(default=None, compare=False)
    replacement: Callable | None = field(default=None, compare=False)
    example_args: tuple = field(default=(), compare=False)
    extra_check: Callable[..., bool | str] | None = field(default=None, compare=False)
    match_dtypes: tuple[torch.dtype, ...] | None = None
    heavy_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.replaces:
            object.__setattr__(self, "replaces", self.name)
        if self.replaces not in KNOWN_PATTERNS:
            raise ValueError(
                f"kernel {self.name!r}: replaces={self.replaces!r} is not a known chain pattern; "
                f"known: {', '.join(KNOWN_PATTERNS)}"
            )

    def supports(self, dtype: torch.dtype, row_elems: int | None) -> tuple[bool, str]:
        """Whether the kernel can take a chain of ``dtype`` with rows of ``row_elems`` elements.

        Returns ``(ok, reason)``; ``reason`` names the violated constraint when ``ok`` is False.
        """
        if dtype not in self.dtypes:
            return False, f"dtype {dtype} not in {[str(d) for d in self.dtypes]}"
        if self.max_row_elems is not None and row_elems is not None and row_elems > self.max_row_elems:
            return False, f"row of {row_elems} elements exceeds the kernel's limit of {self.max_row_elems}"
        return True, ""


#: All registered kernels by name; filled by :func:`register_kernel`.
KERNELS: dict[str, KernelEntry] = {}


def register_kernel(entry: KernelEntry) -> KernelEntry:
    """Add ``entry`` to :data:`KERNELS` and return it.

    Raises:
        ValueError: a different kernel is already registered under the same name.
    """
    existing = KERNELS.get(entry.name)
    if existing is not None and existing.module != entry.module:
        raise ValueError(f"kernel {entry.name!r} registered twice ({existing.module} and {entry.module})")
    KERNELS[entry.name] = entry
    return entry


def load_all() -> dict[str, KernelEntry]:
    """Import every kernel module of the package so that all kernels are registered; return :data:`KERNELS`."""
    import kernel_library

    for info in pkgutil.iter_modules(kernel_library.__path__):
        if not info.name.startswith("_") and info.name != "registry":
            importlib.import_module(f"kernel_library.{info.name}")
    return KERNELS


def get_kernel(name: str) -> KernelEntry:
    """The kernel registered as ``name``.

    Raises:
        KeyError: no such kernel; the message lists the known ones.
    """
    load_all()
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known kernels: {', '.join(sorted(KERNELS)) or '(none)'}") from None


def entry_shapes(name: str, module) -> list[dict]:
    """The benchmark shapes of the registry entry ``name``: the dicts of ``module.BENCH_SHAPES`` (keyword arguments
    of the module's ``make_inputs``) that exercise it.

    A module registering two entries (layernorm / add_layernorm, softmax / masked_softmax) says which entry each
    shape is for with ``bench_entry(shape) -> name``; a module without it has one entry, all its shapes. A module
    without ``BENCH_SHAPES`` has none (``[]``). The GPU benchmarks (``benchmarks/kernels/compare.py``,
    ``benchmarks/host/host_overhead.py``) time these shapes.
    """
    pick = getattr(module, "bench_entry", None)
    return [s for s in getattr(module, "BENCH_SHAPES", []) if pick is None or pick(s) == name]


def kernels_for_pattern(pattern: str) -> list[KernelEntry]:
    """All registered kernels that replace chain pattern ``pattern`` (possibly empty)."""
    load_all()
    return [k for k in KERNELS.values() if k.replaces == pattern]
