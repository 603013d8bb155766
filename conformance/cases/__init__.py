"""What is run: the case model (:mod:`.case`), its tensors (:mod:`.inputs`), sweep axes and grids
(:mod:`.sweep`) and the named suites (:mod:`.suites`, their sweeps by family in ``suite_*.py``).

A new case field goes into :class:`~.case.AttentionCase` (with a default, so old records keep their
ids) and, if it changes the tensors, into :func:`~.inputs.make_inputs`; a new axis value is one
table entry in :mod:`.sweep`; a new sweep is one entry in its family's
``suite_*.py`` (a new suite one entry in :data:`.suites.SUITES`).
"""

from .case import DTYPES, FEATURES, LAYOUTS, AttentionCase
from .inputs import CaseInputs, make_inputs

__all__ = ["DTYPES", "FEATURES", "LAYOUTS", "AttentionCase", "CaseInputs", "make_inputs"]
