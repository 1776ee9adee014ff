"""The V1 model runner's DP coordination, loaded from a release and run.

``coordinate_batch_across_dp`` (``vllm/v1/worker/dp_utils.py``, 0.11.1 and
later) is executed from its source; from 0.12 its caller,
``GPUModelRunner._determine_batch_execution_and_padding``, is taken out of
``gpu_model_runner.py`` and run unbound on a strict stand-in ``self``
(:mod:`~dpsim.targets.v1.caller`) with the release's own
``CudagraphDispatcher`` (:mod:`~dpsim.targets.v1.dispatcher`);
:mod:`~dpsim.targets.v1.api` gives the uniform call interface.
"""
