"""``max_tokens`` is a hard bound in every engine, in process: a logit bias forcing one
byte of a UTF-8 character (``test_support.byte_probes``) generates exactly the tokens
asked for and no more.

llama-cpp-python's own completion loop did not stop there: while its text ended in an
unfinished character it skipped the count, generated until the context was full and
failed (``llama_decode returned 1``). A model wrapped by ``for_llama_cpp`` (and the model
``anylogits serve llama-cpp`` serves) stops at ``max_tokens`` whatever the processors,
the native ``logit_bias`` included; completions, chat completions and streams report
``finish_reason="length"``, as a completion that reached its ``max_tokens`` does. The
servers: ``server_suite`` and ``test_vllm_server``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from anylogits import LogitBias, NoRepeatNGram
from anylogits.engines.generation import GenerationEngine
from test_support.byte_probes import BYTE_PROBES, forced_byte
from test_support.generation_cases import COUNTING

pytestmark = pytest.mark.slow

MAX_TOKENS = 4


@pytest.mark.parametrize("probe", sorted(BYTE_PROBES))
def test_generation_stops_at_max_tokens_on_a_forced_byte(
    probe: str, engine: GenerationEngine
) -> None:
    """Each engine's own generation loop, our processor forcing the byte."""
    forced = forced_byte(engine.vocabulary, probe)
    tokens = engine.greedy(engine.encode(COUNTING), [LogitBias({forced: 100.0})], n=MAX_TOKENS)
    assert tokens == [forced] * MAX_TOKENS


@pytest.fixture(scope="module")
def llama_cpp_models(engines: Any) -> tuple[Any, Any]:
    """(the tiny model wrapped by ``for_llama_cpp``, the same file in a plain ``Llama``)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    wrapped = engines["llama_cpp"]
    wrapped.hook(NoRepeatNGram(9))  # for_llama_cpp: from now on every completion is bound
    plain = llama_cpp.Llama(
        model_path=wrapped.llm.model_path, n_ctx=128, n_threads=1, verbose=False
    )
    return wrapped, plain


def _complete(llm: Any, endpoint: str, stream: bool, **options: Any) -> tuple[str, int | None]:
    """(finish_reason, completion tokens: ``None`` when streamed) of one greedy request."""
    common = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": stream, **options}
    if endpoint == "completions":
        result = llm.create_completion(COUNTING, **common)
    else:
        result = llm.create_chat_completion([{"role": "user", "content": COUNTING}], **common)
    if not stream:
        return result["choices"][0]["finish_reason"], result["usage"]["completion_tokens"]
    chunks = list(result)
    reasons = [choice.get("finish_reason") for chunk in chunks for choice in chunk["choices"]]
    return next(reason for reason in reasons if reason is not None), None


@pytest.mark.only_backend("llama_cpp")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("how", ["native_logit_bias", "anylogits"])
@pytest.mark.parametrize("probe", sorted(BYTE_PROBES))
def test_llama_cpp_completions_stop_at_max_tokens(
    probe: str, how: str, endpoint: str, stream: bool, llama_cpp_models: tuple[Any, Any]
) -> None:
    engine, _ = llama_cpp_models
    forced = forced_byte(engine.vocabulary, probe)
    if how == "native_logit_bias":
        options: dict[str, Any] = {"logit_bias": {forced: 100.0}}
    else:
        options = {"logits_processor": engine.hook(LogitBias({forced: 100.0}), NoRepeatNGram(9))}
    started = time.monotonic()
    reason, tokens = _complete(engine.llm, endpoint, stream, **options)
    assert reason == "length"
    assert tokens in (None, MAX_TOKENS)
    assert time.monotonic() - started < 30


@pytest.mark.only_backend("llama_cpp")
def test_without_the_bound_llama_cpp_runs_past_max_tokens(
    llama_cpp_models: tuple[Any, Any],
) -> None:
    """The oracle: the same request on a plain ``Llama`` generates until its context is
    full and fails, so the test above proves the bound."""
    engine, plain = llama_cpp_models
    forced = forced_byte(engine.vocabulary, "lead_byte")
    with pytest.raises(RuntimeError, match="llama_decode returned"):
        plain.create_completion(
            COUNTING, max_tokens=MAX_TOKENS, temperature=0.0, logit_bias={forced: 100.0}
        )
    # A whole character at max_tokens: llama-cpp-python counted those itself.
    bound = plain.create_completion(COUNTING, max_tokens=MAX_TOKENS, temperature=0.0)
    assert bound["usage"]["completion_tokens"] == MAX_TOKENS


@pytest.mark.only_backend("llama_cpp")
def test_a_byte_fallback_token_stops_at_max_tokens(tmp_path: Any) -> None:
    """A SentencePiece vocabulary's ``<0xE3>`` (the tiny model built with Llama 2's
    vocabulary): the same hang on a plain ``Llama``, the bound with ``for_llama_cpp``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from anylogits import for_llama_cpp
    from anylogits.adapters.llama_cpp import vocabulary_of
    from anylogits.testing.tiny_model import TinyModelSpec, build_tiny_gguf

    path = str(build_tiny_gguf(TinyModelSpec(vocab="llama-spm")))
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, n_threads=1, verbose=False)
    fallback = next(
        token_id
        for token_id in range(llm.n_vocab())
        if llm._model.token_get_text(token_id) == "<0xE3>"
    )
    assert vocabulary_of(llm).tokens[fallback] == b"\xe3"
    bias = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "logit_bias": {fallback: 100.0}}
    with pytest.raises(RuntimeError, match="llama_decode returned"):
        llm.create_completion("1 2 3", **bias)
    hook = for_llama_cpp(NoRepeatNGram(9), model=llm)
    result = llm.create_completion("1 2 3", logits_processor=hook, **bias)
    assert result["usage"]["completion_tokens"] == MAX_TOKENS
    assert result["choices"][0]["finish_reason"] == "length"
    # Without processors too: the model is bound once it has been wrapped.
    assert llm.create_completion("1 2 3", **bias)["usage"]["completion_tokens"] == MAX_TOKENS
