"""Each engine driven one way, for the demo, ``check_processor``, the conformance suite and
the benchmarks.

* :mod:`~anylogits.engines.backends`: one class per backend (transformers, llama.cpp, MLX,
  vLLM) that builds its native hook from anylogits processors and calls it the way that
  backend does, plus the ``BACKENDS`` registry.
* :mod:`~anylogits.engines.check_backends`: ``anylogits.testing.check_processor``, which
  hands the backends named to the check of :mod:`anylogits.testing.check` (the testing
  package stands below the engines, which use its tiny model).
* :mod:`~anylogits.engines.generation`: each backend's generation (greedy, sampled,
  structured) behind the ``GenerationEngine`` protocol (``vllm_recording`` holds vLLM's
  counting processor).
* :mod:`~anylogits.engines.native`: a job in each engine's own parameters (the reference
  the demo and the benchmarks compare with).
* :mod:`~anylogits.engines.real_model`: SmolLM2-135M-Instruct, fetched from PyPI once and
  prepared for every engine.

Backend libraries are imported only where a driver needs them. Not public API: the
drivers follow the engines, and may change without notice.
"""
