"""User-facing errors. Each carries a short message that names the file, line, rule or op at fault.

The CLI prints ``error: <message>`` and exits non-zero; the traceback is shown only with ``--debug``.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (file, model, rules, options), not a bug in fusion-advisor."""

    exit_code = 2


class ModelLoadError(UserError):
    """The model file is missing, does not import, or follows no known convention."""


class ModelRunError(UserError):
    """The model, or its ``get_inputs()``, raised while being built or run."""


class CaptureError(UserError):
    """No graph could be captured from the model by any method."""


class RulesError(UserError):
    """A rules file is unreadable or invalid; the message names the file, the rule id and the field."""


class DeviceSpecError(UserError):
    """An unknown device-spec name or an invalid device-spec YAML."""


class ProfileError(UserError):
    """Profiling was asked for where it cannot run (meta device, a GPU the profiler cannot see) or measured nothing."""


class CalibrationError(UserError):
    """``calibrate`` cannot measure on the asked device or cannot write its spec file."""


class ContractError(UserError):
    """A kernel file lacks the contract ``kernel_fn``, ``reference_fn``, ``get_inputs()``."""


class KernelLoadError(UserError):
    """A kernel file or ``kernel_library`` module is missing or does not import (the message names file and line)."""


class VerificationFailed(UserError):
    """A kernel failed ``verify``, so ``bench`` refuses to time it; ``result`` holds the :class:`VerifyResult`."""

    exit_code = 1

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result
