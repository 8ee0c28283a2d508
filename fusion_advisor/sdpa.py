"""Old path of :mod:`fusion_advisor.analyze.sdpa`, kept only because ``rules/default.yaml`` cites
``fusion_advisor/sdpa.py`` (two reasons: the math backend's fallback and ``BOOL_MASK_KERNELS``) and
``tests/test_rules.py`` checks that every file a shipped rule cites exists. When the rules cite
``fusion_advisor/analyze/sdpa.py``, delete this file. Import from :mod:`fusion_advisor.analyze.sdpa`.
"""

from fusion_advisor.analyze.sdpa import *  # noqa: F401,F403
from fusion_advisor.analyze.sdpa import BOOL_MASK_KERNELS  # noqa: F401  (the name the rules cite)
