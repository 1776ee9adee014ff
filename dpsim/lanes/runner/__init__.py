"""The runner lane: vLLM's real engine loop, worker, model runner and
speculators run per virtual rank, with GPU, triton and model work stood in for.

Layers, bottom up:

* framework: :mod:`.strict` (strict stand-ins and the gap log: anything the
  real code asks that dpsim does not model refuses the run), :mod:`.extract`
  (a real vLLM class rebuilt from chosen methods of its file, with the real
  file name and line numbers), :mod:`.sources` (which vLLM files the lane
  reads, per release or tree), :mod:`.where` (vLLM locations and line
  coverage);
* the ranks' code: ``forward``, ``model_runner``, ``worker``,
  ``speculators``, ``engine``, ``coordinator``;
* what drives them: ``stream``, ``scheduler`` (vLLM's Scheduler is MODELLED:
  what it schedules is what Hypothesis draws), ``generate``;
* a run: ``case``, ``run``, ``syncs`` (each real DP sync recorded for the sync
  lane's properties).
"""
