"""What every layer passes around, as plain frozen types: the shared vocabulary.

A case and its rank batches, the trace and its events, the records a sync and
the oracle leave in it, group names, the capture policy and the cudagraph
mode. Both lanes produce these, properties judge them, counterexample files
and reports serialise them at the edge. Nothing here imports torch or a
target, so any layer (and a reader of counterexample files) can import them
cheaply; ``tests/test_records.py`` holds every module of this package to that.
"""
