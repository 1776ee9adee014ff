"""dpsim's property suite as a package, so any checkout can run it.

``pytest --pyargs dpsim.suite --dpsim-vllm .`` collects
:mod:`dpsim.suite.test_dp_sync` from the installed package; the tests
themselves are built in :mod:`dpsim.suite.build` and shared with
``dpsim fuzz``.
"""
