"""Sweep hooks for library kernels: ``fusion-advisor bench rmsnorm --sweep`` (see ``fusion_advisor/kernel_tools/sweep.py``).

The kernel modules define only the plain contract, so the hooks live here, one :class:`LibrarySweep` per kernel
in :data:`SWEEPS`, with the names a kernel file would define (``SIZES``, ``get_inputs(size)``, ``SWEEP_CONFIGS``,
``kernel_fn(*args, **config)``, ``reference_fn``, ``bytes_moved``). Each ``kernel_fn`` calls the module's own
forward launcher with a forced launch config, so the sweep times exactly the code the library runs:

| kernel | launcher | config class | config keys |
|---|---|---|---|
| ``rmsnorm`` | ``rmsnorm.rms_norm_fwd_launch(..., config=)`` | ``_rows.RowConfig`` | BLOCK_SIZE, num_warps, looped |
| ``softmax`` | ``softmax._softmax_fwd_launch(..., config=)`` | ``softmax.SoftmaxConfig`` | BLOCK_SIZE, num_warps, single_block |
| ``cross_entropy`` | ``cross_entropy._cross_entropy_fwd_launch(..., config=)`` | ``CrossEntropyConfig`` | BLOCK_SIZE, num_warps, single_block |
| ``layernorm`` | ``layernorm.layer_norm_fwd_launch(..., config=)`` | ``_rows.RowConfig`` | BLOCK_SIZE, num_warps, looped |
| ``swiglu``, ``geglu`` | ``swiglu.glu_forward(..., config=)`` | ``swiglu.GluConfig`` | BLOCK_SIZE, num_warps |

The sweep is of the **forward** launch (softmax's and rmsnorm's backward launchers take a config too, but are not
swept here). Cross-entropy's forward writes the gradient as well (``compute_grad=True``, as in training), so its
sweep returns and verifies ``(loss, dlogits)`` against autograd of ``F.cross_entropy``.

Kernels left out: ``add_rmsnorm`` and ``add_layernorm`` (they share rmsnorm's / layernorm's forward launchers,
swept here without the residual); ``masked_softmax`` (softmax's launcher, swept here without a mask);
``bias_gelu`` (``BiasGeluConfig``) and ``rope`` (``RopeConfig``), whose launchers do take a config override of
2-D tiles but have no hooks here yet; ``gemm_epilogue`` is ``triton.autotune``-d and can be swept as a file once
it defines sizes.

Each ``heuristic(size)`` is the config the library's own heuristic picks at that size; it is always the first
config swept, so a sweep says whether the heuristic chose the best one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton

from kernel_library import _device
from kernel_library import cross_entropy as _ce
from kernel_library import geglu as _geglu
from kernel_library import layernorm as _ln
from kernel_library import rmsnorm as _rms
from kernel_library import softmax as _sm
from kernel_library import swiglu as _swiglu


@dataclass(frozen=True)
class LibrarySweep:
    """The sweep hooks of one library kernel, under the names a kernel file uses (see the module doc).

    Attributes:
        SIZES: sizes passed to ``get_inputs(size)``: ``(n_rows, n_cols)``; realistic on a GPU, small on the CPU
            interpreter.
        get_inputs: ``get_inputs(size)`` -> fresh arguments on the kernels' device (no grad).
        SWEEP_CONFIGS: ``SWEEP_CONFIGS(size)`` -> the candidate configs at that size.
        kernel_fn: ``kernel_fn(*args, **config)``: the module's forward launcher with that config.
        reference_fn: plain PyTorch, same arguments.
        bytes_moved: fewest bytes the forward moves (bytes).
        heuristic: ``heuristic(size)`` -> the config the library picks itself.
    """

    SIZES: list[tuple[int, int]]
    get_inputs: Callable[..., list]
    SWEEP_CONFIGS: Callable[[tuple[int, int]], list[dict[str, Any]]]
    kernel_fn: Callable[..., Any]
    reference_fn: Callable[..., Any]
    bytes_moved: Callable[..., int]
    heuristic: Callable[[tuple[int, int]], dict[str, Any]]


#: Warps tried for a block held in registers; looped chunk sizes and their warps (GPU).
SINGLE_WARPS = (4, 8, 16, 32)
LOOP_BLOCKS = (2048, 4096, 8192, 16384)
LOOP_WARPS = (4, 8, 16)
#: Widest row tried as one block in registers: wider ones spill and take minutes to compile.
MAX_SWEPT_SINGLE_BLOCK = 32768
#: Fewest warps for a single block: at most this many elements per thread (fewer warps would hold hundreds of
#: fp32 values per thread, spill, and take long to compile for a config that cannot win).
MAX_ELEMS_PER_THREAD_SINGLE = 64
#: Under the CPU interpreter (where num_warps is ignored) a few small configs keep the sweep to seconds.
CPU_CONFIGS_SINGLE_WARPS = (4,)
CPU_LOOP_BLOCKS = (256, 512)


def _row_configs(n_cols: int, single_key: str, single_value: bool) -> list[dict[str, Any]]:
    """Configs for a row-wise kernel: the whole row in one block (``single_key=single_value``), or chunks."""
    row_block = triton.next_power_of_2(max(n_cols, 1))
    gpu = _device.on_gpu()
    single_warps = SINGLE_WARPS if gpu else CPU_CONFIGS_SINGLE_WARPS
    loop_blocks = LOOP_BLOCKS if gpu else CPU_LOOP_BLOCKS
    loop_warps = LOOP_WARPS if gpu else (4,)
    configs: list[dict[str, Any]] = []
    if row_block <= MAX_SWEPT_SINGLE_BLOCK:
        configs += [{"BLOCK_SIZE": row_block, "num_warps": w, single_key: single_value} for w in single_warps
                    if not gpu or row_block <= 32 * w * MAX_ELEMS_PER_THREAD_SINGLE]
    configs += [{"BLOCK_SIZE": b, "num_warps": w, single_key: not single_value}
                for b in loop_blocks if b < row_block for w in loop_warps]
    return configs


def _with_heuristic(configs: list[dict[str, Any]], heuristic: dict[str, Any]) -> list[dict[str, Any]]:
    """``configs`` with the library heuristic's own config first (added when the grid lacks it)."""
    return [heuristic] + [c for c in configs if c != heuristic]


def _randn(shape: tuple[int, ...], std: float, dtype: torch.dtype) -> torch.Tensor:
    """N(0, std^2) drawn on the kernels' device (``make_inputs`` draws on the CPU: seconds at 1e9 elements)."""
    device = _device.default_device()
    gen = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(shape, generator=gen, device=device) * std).to(dtype)


def _dtype() -> torch.dtype:
    """bf16 on a GPU (the anchors' dtype), fp32 on the CPU interpreter."""
    return torch.bfloat16 if _device.on_gpu() else torch.float32


# --- rmsnorm ------------------------------------------------------------------------------------------------


def _rms_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0, *,
                BLOCK_SIZE: int, num_warps: int, looped: bool) -> torch.Tensor:
    """rmsnorm forward of ``x`` [..., n_cols] with the given :class:`kernel_library._rows.RowConfig`."""
    cfg = _rms.RowConfig(block_size=BLOCK_SIZE, num_warps=num_warps, looped=looped)
    y, _ = _rms.rms_norm_fwd_launch(_rms.as_rows(x, x.shape[-1]), weight, float(eps), float(offset), config=cfg)
    return y.reshape(x.shape)


def _rms_inputs(size: tuple[int, int]) -> list:
    """``rmsnorm.make_inputs`` (drawn on the kernels' device) without grad."""
    n_rows, n_cols = size
    return _rms.make_inputs(n_rows, n_cols, _dtype(), requires_grad=False)


def _rms_heuristic(size: tuple[int, int]) -> dict[str, Any]:
    c = _rms.RowConfig.forward(size[1])
    return {"BLOCK_SIZE": c.block_size, "num_warps": c.num_warps, "looped": c.looped}


RMSNORM = LibrarySweep(
    SIZES=[(8192, 4096), (1, 4096), (32, 4096), (8192, 8192), (4096, 16384), (256, 131072)] if _device.on_gpu()
    else [(4, 1000), (2, 1500)],
    get_inputs=_rms_inputs,
    SWEEP_CONFIGS=lambda size: _with_heuristic(_row_configs(size[1], "looped", False), _rms_heuristic(size)),
    kernel_fn=_rms_kernel,
    reference_fn=_rms.reference_fn,
    bytes_moved=_rms.bytes_moved,
    heuristic=_rms_heuristic,
)


# --- softmax ------------------------------------------------------------------------------------------------


def _softmax_kernel(x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None, causal: bool = False, *,
                    BLOCK_SIZE: int, num_warps: int, single_block: bool) -> torch.Tensor:
    """softmax forward with the given :class:`kernel_library.softmax.SoftmaxConfig`."""
    cfg = _sm.SoftmaxConfig(block_size=BLOCK_SIZE, num_warps=num_warps, single_block=single_block)
    return _sm._softmax_fwd_launch(x, scale, mask, causal, config=cfg)


def _softmax_inputs(size: tuple[int, int]) -> list:
    """``[x [n_rows, n_cols], 1.0, None, False]``, x ~ N(0, 9) as in ``softmax.make_inputs``."""
    return [_randn(tuple(size), 3.0, _dtype()), 1.0, None, False]


def _softmax_heuristic(size: tuple[int, int]) -> dict[str, Any]:
    c = _sm.SoftmaxConfig.for_row(size[1])
    return {"BLOCK_SIZE": c.block_size, "num_warps": c.num_warps, "single_block": c.single_block}


#: GPU grid: the reference rows (8192 x 32000 / 128256) and a reduced grid of widths 512 .. 262144 by rows 1 .. 65536
#: (cells above 2**30 elements left out: a 4 GiB bf16 input and its float64 reference would dominate the run).
SOFTMAX_GPU_SIZES = [(8192, 32000), (8192, 128256)] + [
    (rows, width) for rows in (1, 64, 4096, 65536) for width in (512, 4096, 32768, 262144) if rows * width <= 2**30
]

SOFTMAX = LibrarySweep(
    SIZES=SOFTMAX_GPU_SIZES if _device.on_gpu() else [(4, 1000), (2, 3000)],
    get_inputs=_softmax_inputs,
    SWEEP_CONFIGS=lambda size: _with_heuristic(_row_configs(size[1], "single_block", True),
                                               _softmax_heuristic(size)),
    kernel_fn=_softmax_kernel,
    reference_fn=_sm.reference_fn,
    bytes_moved=_sm.bytes_moved,
    heuristic=_softmax_heuristic,
)


# --- cross_entropy ------------------------------------------------------------------------------------------


def _ce_kernel(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
               reduction: str = "mean", *, BLOCK_SIZE: int, num_warps: int,
               single_block: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, dlogits)`` of the fused forward (gradient written in the forward, as in training) with the given
    :class:`kernel_library.cross_entropy.CrossEntropyConfig`."""
    cfg = _ce.CrossEntropyConfig(block_size=BLOCK_SIZE, num_warps=num_warps, single_block=single_block)
    return _ce._cross_entropy_fwd_launch(logits, target, int(ignore_index), float(label_smoothing), reduction,
                                         True, None, config=cfg)


def _ce_reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, d loss / d logits)`` from ``cross_entropy.reference_fn`` and autograd, in the logits' dtype."""
    with torch.enable_grad():
        leaf = logits.detach().requires_grad_(True)
        loss = _ce.reference_fn(leaf, target, ignore_index, label_smoothing, reduction)
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad.to(logits.dtype)


#: Share of targets set to ignore_index, as ``cross_entropy.make_inputs`` (HF pads shifted labels with -100).
IGNORE_FRAC = 0.05


def _ce_inputs(size: tuple[int, int]) -> list:
    """``[logits [n_tokens, vocab] ~ N(0, 4), target [n_tokens], -100, 0.0, "mean"]``, 5% of targets ignored."""
    n_tokens, vocab = size
    logits = _randn((n_tokens, vocab), 2.0, _dtype())
    gen = torch.Generator(device=logits.device).manual_seed(1)
    target = torch.randint(0, vocab, (n_tokens,), generator=gen, device=logits.device)
    ignored = torch.rand(n_tokens, generator=gen, device=logits.device) < IGNORE_FRAC
    return [logits, target.masked_fill(ignored, -100), -100, 0.0, "mean"]


def _ce_bytes(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
              reduction: str = "mean") -> int:
    """Fewest bytes of the fused forward with the gradient: read logits and targets, write dlogits and the loss
    (``cross_entropy.bytes_moved`` for logits that require grad)."""
    n_tokens = logits.shape[0]
    logit_bytes = logits.numel() * logits.element_size()
    loss_bytes = (n_tokens if reduction == "none" else 1) * logits.element_size()
    return 2 * logit_bytes + target.numel() * target.element_size() + loss_bytes


def _ce_heuristic(size: tuple[int, int]) -> dict[str, Any]:
    c = _ce.CrossEntropyConfig.for_vocab(size[1])
    return {"BLOCK_SIZE": c.block_size, "num_warps": c.num_warps, "single_block": c.single_block}


CROSS_ENTROPY = LibrarySweep(
    SIZES=[(8192, 32000), (8192, 128256), (4096, 256000), (64, 128256), (8192, 4096)] if _device.on_gpu()
    else [(8, 1000), (4, 3000)],
    get_inputs=_ce_inputs,
    SWEEP_CONFIGS=lambda size: _with_heuristic(_row_configs(size[1], "single_block", True), _ce_heuristic(size)),
    kernel_fn=_ce_kernel,
    reference_fn=_ce_reference,
    bytes_moved=_ce_bytes,
    heuristic=_ce_heuristic,
)


# --- layernorm ----------------------------------------------------------------------------------------------


def _ln_kernel(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5,
               residual: torch.Tensor | None = None, *, BLOCK_SIZE: int, num_warps: int, looped: bool) -> torch.Tensor:
    """layernorm forward of ``x`` [n_rows, n_cols] (no residual) with the given ``_rows.RowConfig``."""
    if residual is not None:
        raise ValueError("the layernorm sweep covers plain LayerNorm (no residual)")
    cfg = _rms.RowConfig(block_size=BLOCK_SIZE, num_warps=num_warps, looped=looped)
    y, _ = _ln.layer_norm_fwd_launch(_rms.as_rows(x, x.shape[-1]), weight, bias, float(eps), config=cfg)
    return y.reshape(x.shape)


def _ln_heuristic(size: tuple[int, int]) -> dict[str, Any]:
    c = _rms.RowConfig.forward(size[1])
    return {"BLOCK_SIZE": c.block_size, "num_warps": c.num_warps, "looped": c.looped}


LAYERNORM = LibrarySweep(
    SIZES=[(8192, 4096), (1, 4096), (8192, 768), (4096, 16384), (256, 131072)] if _device.on_gpu()
    else [(4, 1000)],
    get_inputs=lambda size: _ln.make_inputs(size[0], size[1], _dtype(), requires_grad=False),
    SWEEP_CONFIGS=lambda size: _with_heuristic(_row_configs(size[1], "looped", False), _ln_heuristic(size)),
    kernel_fn=_ln_kernel,
    reference_fn=_ln.reference_fn,
    bytes_moved=_ln.bytes_moved,
    heuristic=_ln_heuristic,
)


# --- swiglu, geglu ------------------------------------------------------------------------------------------

#: Elementwise blocks and warps tried (GPU); the CPU interpreter tries two blocks.
GLU_BLOCKS = (512, 1024, 2048, 4096)
GLU_WARPS = (2, 4, 8)
CPU_GLU_BLOCKS = (256, 1024)


def _glu_kernel(activation: str):
    def kernel_fn(a: torch.Tensor, b: torch.Tensor, *, BLOCK_SIZE: int, num_warps: int) -> torch.Tensor:
        """``act(a) * b`` by ``swiglu.glu_forward`` with the given ``swiglu.GluConfig``."""
        return _swiglu.glu_forward(a, b, activation, config=_swiglu.GluConfig(BLOCK_SIZE, num_warps))

    return kernel_fn


def _glu_configs(size: tuple[int, int]) -> list[dict[str, Any]]:
    if not _device.on_gpu():
        return [{"BLOCK_SIZE": b, "num_warps": 4} for b in CPU_GLU_BLOCKS]
    return [{"BLOCK_SIZE": b, "num_warps": w} for b in GLU_BLOCKS for w in GLU_WARPS]


def _glu_heuristic(size: tuple[int, int]) -> dict[str, Any]:
    # contiguous operands run as one flat row of n_rows * n_cols elements (swiglu._as_rows)
    c = _swiglu.GluConfig.from_cols(size[0] * size[1])
    return {"BLOCK_SIZE": c.block_size, "num_warps": c.num_warps}


def _glu(activation: str, module: Any) -> LibrarySweep:
    return LibrarySweep(
        SIZES=[(8192, 11008), (8192, 14336), (32, 11008)] if _device.on_gpu() else [(8, 1000)],
        get_inputs=lambda size: module.make_inputs(size[0], size[1], _dtype(), requires_grad=False),
        SWEEP_CONFIGS=lambda size: _with_heuristic(_glu_configs(size), _glu_heuristic(size)),
        kernel_fn=_glu_kernel(activation),
        reference_fn=module.reference_fn,
        bytes_moved=module.bytes_moved,
        heuristic=_glu_heuristic,
    )


SWIGLU = _glu("silu", _swiglu)
GEGLU = _glu("gelu_tanh", _geglu)


#: Library kernel name -> its sweep hooks.
SWEEPS: dict[str, LibrarySweep] = {"rmsnorm": RMSNORM, "softmax": SOFTMAX, "cross_entropy": CROSS_ENTROPY,
                                   "layernorm": LAYERNORM, "swiglu": SWIGLU, "geglu": GEGLU}
