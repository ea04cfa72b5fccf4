"""Validation rules that need the effect layer (tools, models, knowledge bases).

They register themselves with :func:`graphrun.runtime.validate.register_rule` and
are marked ``deep``: ``Check(deep=False)`` skips them.
"""

from __future__ import annotations
