"""fp32 activation functions and their derivatives for Triton kernels: GELU (erf and tanh forms) and SiLU.

Each takes and returns an fp32 tensor inside a ``@triton.jit`` function and matches torch's eager function
(``F.gelu``, ``F.gelu(approximate="tanh")``, ``F.silu``), -inf giving NaN as torch's does. Used by bias_gelu,
swiglu / geglu and gemm_epilogue. Tensor operand first in products with the constexpr constants: TRITON_INTERPRET
fails on ``constexpr * tensor`` fed to tl.sigmoid.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: 1/sqrt(2): erf-GELU is 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016; torch ``F.gelu``).
SQRT1_2: tl.constexpr = tl.constexpr(0.7071067811865476)
#: 1/sqrt(2 pi): the standard normal pdf's constant, in erf-GELU's derivative Phi(x) + x phi(x).
INV_SQRT_2PI: tl.constexpr = tl.constexpr(0.3989422804014327)
#: 2 sqrt(2/pi): tanh-GELU 0.5 x (1 + tanh(u)) with u = sqrt(2/pi)(x + 0.044715 x^3) equals x * sigmoid(2u),
#: which needs no tanh (missing from tl.math) and has no cancellation near 1 + tanh(u) = 0.
TANH_SCALE_X2: tl.constexpr = tl.constexpr(1.5957691216057308)
#: The cubic coefficient of tanh-GELU (same paper; torch ``approximate="tanh"``).
TANH_CUBIC: tl.constexpr = tl.constexpr(0.044715)


@triton.jit
def gelu_erf(x):
    """GELU(x) = 0.5 x (1 + erf(x / sqrt 2)); ``x`` fp32. Matches ``F.gelu(x)``; -inf gives NaN as in torch."""
    return 0.5 * x * (1.0 + tl.math.erf(x * SQRT1_2))


@triton.jit
def gelu_erf_grad(x):
    """d GELU(x) / dx = Phi(x) + x phi(x); ``x`` fp32."""
    cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT1_2))
    pdf = tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    return cdf + x * pdf


@triton.jit
def gelu_tanh(x):
    """tanh-GELU 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) written as x * sigmoid(2u); ``x`` fp32.

    Matches ``F.gelu(x, approximate="tanh")``; -inf gives NaN (-inf * 0) as in torch.
    """
    return x * tl.sigmoid(x * TANH_SCALE_X2 * (1.0 + x * x * TANH_CUBIC))


@triton.jit
def gelu_tanh_grad(x):
    """d/dx [x sigmoid(z)] = s + x s (1 - s) z' with z = 2 sqrt(2/pi)(x + 0.044715 x^3); ``x`` fp32."""
    s = tl.sigmoid(x * TANH_SCALE_X2 * (1.0 + x * x * TANH_CUBIC))
    dz = (1.0 + x * x * (3.0 * TANH_CUBIC)) * TANH_SCALE_X2
    return s + x * s * (1.0 - s) * dz


@triton.jit
def silu(x):
    """SiLU(x) = x * sigmoid(x); ``x`` fp32. Matches ``F.silu``; -inf gives NaN as in torch."""
    return x * tl.sigmoid(x)


@triton.jit
def silu_grad(x):
    """d SiLU / dx = s (1 + x (1 - s)), s = sigmoid(x); ``x`` fp32."""
    s = tl.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))
