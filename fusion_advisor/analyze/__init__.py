"""analyze: a model file -> the chains worth fusing, each costed and routed.

The stages, in the order :mod:`fusion_advisor.analyze.pipeline` runs them, each passing the typed records of
:mod:`fusion_advisor.analyze.records`:

    load -> capture -> graph (sdpa) -> chains -> roofline -> rules -> route   [-> profile, inductor_code]

:mod:`~fusion_advisor.analyze.profile` (``analyze --profile``) measures what the roofline predicts,
:mod:`~fusion_advisor.analyze.accuracy` compares the two, :mod:`~fusion_advisor.analyze.inductor_code`
(``analyze --inductor-code``) keeps Inductor's code per routed chain. The report is written by
:mod:`fusion_advisor.report`.
"""
