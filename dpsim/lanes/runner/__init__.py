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
  lane's properties), ``heap`` (the long-lived heap kept out of the
  collector's walks between cases);
* searching and showing: ``check`` (Hypothesis over runner cases), ``suite``
  (the pytest plugin's and ``fuzz``'s test), ``report`` (``targets`` and
  ``bench``), ``commands`` (the lane's side of ``check``, ``replay`` and
  ``versions``);
* real processes: ``processes`` (the parent), ``rank_process`` (one rank),
  ``relay`` (their messages), ``schedule`` (the simulator's order of the
  coordinator's messages, which the real run follows).
"""
