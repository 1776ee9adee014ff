"""How ``dpsim check`` searches for cases: the engines beside Hypothesis' own.

:mod:`dpsim.search.fast` is ``--engine fast``: cases drawn by dpsim from
Hypothesis' strategies without Hypothesis' engine (:mod:`~dpsim.search.draw`),
the first failing one shrunk by that engine (:mod:`~dpsim.search.shrink`),
whose shrinker gets one pass of dpsim's (:mod:`~dpsim.search.counted`).
Every Hypothesis internal they use is in :mod:`~dpsim.search.internals`.
:mod:`~dpsim.search.options` is the command-line option, and
:mod:`~dpsim.search.bounded` bounds either engine's shrink by work. Importing this
package imports none of them, so the default engine never depends on
Hypothesis' internals.
"""
