"""dpsim: simulation and property testing for vLLM's data-parallel sync."""

__version__ = "0.1.0"
