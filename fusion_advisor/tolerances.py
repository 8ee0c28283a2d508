"""Tolerances by dtype and the error policy: kept here for existing imports; they live in
:mod:`fusion_advisor.verification.policy` (see its module docstring for the policy and its reasons)."""

from fusion_advisor.verification.policy import (  # noqa: F401
    ERROR_FLOOR_ULPS,
    MAX_ERROR_FACTOR,
    NORM_ERROR_FACTOR,
    TF32_EPS,
    TF32_FLOOR_UNITS,
    TF32_TOLERANCE,
    TOLERANCES,
    Judgement,
    error_floor,
    judge,
    tolerance_for,
)
