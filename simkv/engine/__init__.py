"""The fast engine (:class:`FastEngine`): only allocation events are events.

:mod:`simkv.reference` does all of this the slow way, and the tests require identical output.
"""

from simkv.engine.session import FastEngine

__all__ = ["FastEngine"]
