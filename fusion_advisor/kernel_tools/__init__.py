"""kernel_tools: check and time a kernel file against its contract (``kernel_fn``, ``reference_fn``, ``get_inputs``).

:mod:`~fusion_advisor.kernel_tools.verify` (``fusion-advisor verify``) runs the verification engine of
:mod:`fusion_advisor.verification` over seeds, hard values and shapes; :mod:`~fusion_advisor.kernel_tools.bench`
(``bench``) times kernel, reference and torch.compile; :mod:`~fusion_advisor.kernel_tools.sweep` (``bench --sweep``)
launch configs x sizes, :mod:`~fusion_advisor.kernel_tools.norm_bwd_sweep` the norm backwards' launch sweeps;
:mod:`~fusion_advisor.kernel_tools.recompile` watches Triton JIT and dynamo compilations.
"""
