"""llama.cpp (llama-cpp-python): a ``LogitsProcessorList`` entry for every completion API,
and llama-cpp-python's OpenAI-compatible server with per-request processors
(:mod:`~anylogits.adapters.llama_cpp.server`).

llama-cpp-python calls the hook from inside llama.cpp's sampler chain (a ctypes
callback) as ``scores[:] = hook(input_ids, scores)``: ``input_ids`` is the 1-D int32
history (prompt included, a slice of a buffer it reuses), ``scores`` a 1-D float32
strided view into llama.cpp's candidate records. Edits in place reach llama.cpp.

One module per concern:

- :mod:`~anylogits.adapters.llama_cpp.hook`: the hook, and the two failure modes of that
  callback it closes: an exception raised inside it is printed and swallowed (generation
  would go on with unprocessed logits), and a ``None`` result turns every logit into NaN.
  A failing hook therefore forces end-of-sequence, and the model's ``generate`` (which
  ``create_completion``, ``__call__`` and ``create_chat_completion`` all run through)
  re-raises the original exception.
- :mod:`~anylogits.adapters.llama_cpp.candidates`: the callback is the first sampler of
  llama.cpp's chain, and edited logits alone would leave llama.cpp normalizing and drawing
  over every token of the vocabulary, the ones our processors set to ``-inf`` included.
  When a ``logits_processor`` list holds our hook, the callback also tells llama.cpp which
  candidates are left, as its own truncating samplers do.
- :mod:`~anylogits.adapters.llama_cpp.budget`: ``max_tokens`` as a hard bound, which
  llama-cpp-python's completion loop skips while its text ends in an unfinished UTF-8
  sequence (a model emitting lead bytes would generate until the context is full).
- :mod:`~anylogits.adapters.llama_cpp.vocabulary`: the model's own vocabulary.
- :mod:`~anylogits.adapters.llama_cpp.server`: the server's wiring.

What of llama-cpp-python this package relies on beyond its documented API, each checked
by name against the pinned version (``LLAMA_CPP_PYTHON_VERSION``) by
``conformance_tests/test_llama_cpp.py::test_every_private_the_adapter_lists_is_there``:

- ``Llama.generate``: wrapped on the user's model (once), to re-raise a hook's error and
  (server) to note the generated ids.
- ``Llama._init_sampler``: wrapped on the user's model (once), to find the sampler chain
  built for a ``logits_processor`` list.
- ``LlamaSampler.custom_samplers``: that chain's custom samplers, ours first.
- ``CustomSampler.apply_func``: the callback llama.cpp calls, replaced by ours.
- ``LlamaSampler.sample``: wrapped, to note the logits row llama.cpp samples from.
- ``Llama._input_ids``: the history the list's processors are given.
- ``Llama._model``: its ``vocab`` handle, for ``llama_token_to_piece`` and the
  end-of-generation and control token tests.
- ``Llama.create_completion``: wrapped on the user's model (once), to bound a
  completion by its ``max_tokens`` (``stopping_criteria`` reaches ``generate``, whose
  loop asks it once more after the last token), and on the served model (server), to add
  a request's processors to its ``logits_processor`` list.
- ``llama_cpp.server.app._llama_proxy``: the model proxy ``create_app`` builds (server).
- ``llama_cpp.server.__main__.create_app``: the name the server command calls, replaced
  while ``anylogits serve llama-cpp`` runs.
"""

from __future__ import annotations

import llama_cpp

from anylogits.adapters.llama_cpp.budget import TokenBudget, bound_max_tokens
from anylogits.adapters.llama_cpp.candidates import (
    SHRINK_BELOW,
    CandidateSetSampler,
    use_candidate_sets,
)
from anylogits.adapters.llama_cpp.hook import (
    AnyLogitsProcessorList,
    HookFailures,
    LlamaCppLogitsProcessor,
    guard_generate,
)
from anylogits.adapters.llama_cpp.vocabulary import vocabulary_of
from anylogits.core.pipeline import Pipeline
from anylogits.core.processor import LogitsProcessor


def for_llama_cpp(
    *processors: LogitsProcessor | Pipeline, model: llama_cpp.Llama
) -> AnyLogitsProcessorList:
    """A ``llama_cpp.LogitsProcessorList`` that runs ``processors`` in order.

    Args:
        *processors: anylogits processors (or pipelines), applied in the order given.
        model: the ``llama_cpp.Llama`` that will generate; its own vocabulary is used,
            and its ``generate`` is wrapped (once) so that a processor error stops the
            generation and is raised to the caller instead of being swallowed. Its
            ``_init_sampler`` is wrapped (once) too, so that llama.cpp samples only from
            the candidates the processors leave (:class:`CandidateSetSampler`), and its
            ``create_completion`` stops every completion at its ``max_tokens``
            (:func:`bound_max_tokens`; llama-cpp-python's own loop does not while the
            text ends in an unfinished UTF-8 sequence).

    Example::

        from llama_cpp import Llama
        from anylogits import NoRepeatNGram, RepetitionPenalty, for_llama_cpp

        llm = Llama(model_path="model.gguf")
        hook = for_llama_cpp(RepetitionPenalty(1.3), NoRepeatNGram(3), model=llm)
        llm.create_completion("Once upon a time", logits_processor=hook, max_tokens=32)
    """
    if not processors:
        raise ValueError("for_llama_cpp needs at least one processor")
    if not isinstance(model, llama_cpp.Llama):
        raise ValueError(
            f"model must be a llama_cpp.Llama, got {type(model).__qualname__}; pass "
            "model=Llama(model_path=...)"
        )
    vocab = vocabulary_of(model)
    hook = LlamaCppLogitsProcessor(
        Pipeline(processors, vocab), model.token_eos(), guard_generate(model)
    )
    use_candidate_sets(model)
    bound_max_tokens(model)
    return AnyLogitsProcessorList([hook])


__all__ = [
    "SHRINK_BELOW",
    "AnyLogitsProcessorList",
    "CandidateSetSampler",
    "HookFailures",
    "LlamaCppLogitsProcessor",
    "TokenBudget",
    "bound_max_tokens",
    "for_llama_cpp",
    "vocabulary_of",
]
