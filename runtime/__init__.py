"""graphrun.runtime.

Importing it registers every node kind (:mod:`graphrun.runtime.nodes`), so the
loader, the validator and the schema know each kind's ``type`` whichever module
of the runtime is imported first.
"""

from graphrun.runtime import nodes as nodes
