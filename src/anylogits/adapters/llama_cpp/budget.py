"""``max_tokens`` as a hard bound on llama-cpp-python's completions.

``Llama._create_completion`` counts a completion's tokens against ``max_tokens`` only
after its multibyte fix, which skips the rest of the loop while the decoded text ends in
an unfinished UTF-8 sequence. A model that keeps emitting lead bytes (a logit bias on one
forces it; a model can also wander into them) therefore generates until the context is
full and then fails with ``llama_decode returned 1``: tens of seconds on a 2k context,
during which a one-slot server serves nobody else, and an HTTP 500 at the end. Plain
``python -m llama_cpp.server`` with ``logit_bias`` does the same.

:func:`bound_max_tokens` wraps two methods of one model, once:

- ``create_completion`` (which ``__call__`` and every chat completion run through) adds
  a :class:`TokenBudget` to the call's ``stopping_criteria``: it travels with the call into
  ``generate``, whatever thread iterates a streamed completion;
- ``generate`` yields at most the budget's tokens (the request's ``max_tokens``, or what
  the context leaves); asked for one more, it ends without another forward pass.

llama-cpp-python's loop then ends by itself and asks its stopping criteria once more:
the budget answers that it cut the completion, so llama-cpp-python decodes every token
generated into the text (an unfinished UTF-8 tail is dropped, as its decoder drops it)
and reports ``finish_reason="stop"``, which the wrapper turns into ``"length"``, what a
completion that reached its ``max_tokens`` reports. A completion that ends as usual (its
``max_tokens`` reached on a whole character, a stop string, end of generation) never
meets the bound and is unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Generator, Sequence
from typing import Any

import llama_cpp
import numpy as np

DEFAULT_MAX_TOKENS = 16  # llama-cpp-python's default for create_completion


class TokenBudget(llama_cpp.StoppingCriteria):  # type: ignore[misc]
    """One completion's ``max_tokens``; as a stopping criterion, whether the bound cut
    the completion.

    Args:
        max_tokens: the completion's ``max_tokens`` (``None`` or ``<= 0``: what the context
            leaves, as llama-cpp-python reads it).
    """

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens
        self.cut = False

    def limit(self, prompt_tokens: int, context: int) -> int:
        """How many tokens the completion of a ``prompt_tokens`` prompt may generate in a
        ``context``-token context."""
        room = max(context - prompt_tokens, 0)
        if self.max_tokens is None or self.max_tokens <= 0:
            return room
        return min(self.max_tokens, room)

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return self.cut


def bound_max_tokens(model: llama_cpp.Llama) -> None:
    """Make ``max_tokens`` a hard bound on every completion of ``model`` (once)."""
    if model.__dict__.get("_anylogits_bounded"):
        return
    create_completion = model.create_completion
    generate = model.generate
    signature = inspect.signature(create_completion)

    @functools.wraps(create_completion)
    def bounded_create_completion(*args: Any, **kwargs: Any) -> Any:
        call = signature.bind(*args, **kwargs)
        budget = TokenBudget(call.arguments.get("max_tokens", DEFAULT_MAX_TOKENS))
        given = call.arguments.get("stopping_criteria")
        call.arguments["stopping_criteria"] = llama_cpp.StoppingCriteriaList(
            [*(given or ()), budget]
        )
        result = create_completion(*call.args, **call.kwargs)
        if isinstance(result, dict):
            return _reported(result, budget)
        return (_reported(chunk, budget) for chunk in result)

    @functools.wraps(generate)
    def bounded_generate(
        tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Any, None]:
        generated = generate(tokens, *args, **kwargs)
        budget = _budget_of(kwargs.get("stopping_criteria"))
        if budget is None:
            return generated
        return _at_most(generated, budget.limit(len(tokens), model.n_ctx()), budget)

    model.create_completion = bounded_create_completion  # type: ignore[method-assign]
    model.generate = bounded_generate  # type: ignore[method-assign]
    model._anylogits_bounded = True  # type: ignore[attr-defined]


def _budget_of(criteria: Any) -> TokenBudget | None:
    for criterion in criteria or ():
        if isinstance(criterion, TokenBudget):
            return criterion
    return None


def _at_most(
    tokens: Generator[int, Any, None], limit: int, budget: TokenBudget
) -> Generator[int, Any, None]:
    """``tokens`` (and ``send`` values) passed through, ``limit`` of them at most."""
    sent = None
    produced = 0
    try:
        while True:
            if produced >= limit:
                budget.cut = True
                return
            try:
                token = tokens.send(sent)
            except StopIteration:
                return
            produced += 1
            sent = yield token
    finally:
        tokens.close()


def _reported(response: Any, budget: TokenBudget) -> Any:
    """A completion (or one streamed chunk of it) as llama-cpp-python reports one that
    reached its ``max_tokens``: ``finish_reason`` ``"length"``."""
    if budget.cut and isinstance(response, dict):
        for choice in response.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason") == "stop":
                choice["finish_reason"] = "length"
    return response
