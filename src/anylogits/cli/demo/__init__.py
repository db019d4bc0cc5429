"""``anylogits demo``: the same processors on every installed engine (transformers,
llama.cpp, MLX, vLLM) with the same weights (a real trained model, or the tiny random one),
in one table against transformers' own processors, with each engine's cost per token
against its own parameters for the job; some cases ask chat messages of their own (a
stop string, JSON, a regex, a watermark) and print what their text means.

One module per part: ``cases`` (the processors and their transformers equivalents),
``measure`` (one case on one engine), ``table`` (the output), ``selection`` (which
engines, and how to install a missing one), ``progress`` (the long steps on stderr) and
``runner`` (:func:`run_demo`). Backend libraries are reached through
:mod:`anylogits.engines.generation`, never imported here, and nothing imports this package
but the command line.
"""

from anylogits.cli.demo.runner import run_demo

__all__ = ["run_demo"]
