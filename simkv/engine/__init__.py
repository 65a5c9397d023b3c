"""The fast engine: only allocation events are events.

Every unit's chain of reallocations over a run of decode steps follows from its capacity
(the unit overflows when the history passes it, and the policy sizes the next buffer), so
the engine computes all chains together (:mod:`simkv.chains`), builds every ledger row of
the run at once, orders them as the runtime would, and derives each step's memory from
running sums. :mod:`simkv.reference` does all of this the slow way, and the tests require
identical output.

Modules, each named after what it plans:

- :mod:`.session`: :class:`FastEngine`, the conductor: the state, the session loop (runs
  planned in chunks), one operation as one step, the commit of a planned run.
- :mod:`.decode_run`: a run of decode steps planned at once (chains, one ordered stream of rows).
- :mod:`.stateless`: the same for a stateless policy (everything allocated and freed each step).
- :mod:`.events`: the rows of a (re)allocation event, for one step and for a run.
- :mod:`.past_view`: the CPU plugin's model-wide past block.
- :mod:`.beam_tables`: the beam tables a GPU kernel keeps per unit.
- :mod:`.residency`: resident memory under first touch.
- :mod:`.oom`: the device's memory, its largest allocation and the headroom limit.
"""

from simkv.engine.session import FastEngine

__all__ = ["FastEngine"]
