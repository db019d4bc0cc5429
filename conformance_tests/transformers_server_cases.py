"""What ``anylogits serve transformers`` adds on both of transformers' paths (imported by
``test_transformers_server`` and ``test_transformers_cb_server``): the OpenAI fields
transformers drops (``presence_penalty``, ``logit_bias`` on completions) or applies from one
request to a whole batch (continuous batching) reach each request's generation as the
catalogue's processors; a request's tokens do not depend on its neighbours' fields."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from anylogits import LogitBias, PresencePenalty, RepetitionPenalty, TopK, to_specs
from anylogits.core.limits import Limits
from anylogits.engines.generation import NEW_TOKENS, GenerationEngine, TransformersEngine
from conformance_tests.server_suite import _extra_body
from test_support.generation_cases import COUNTING

__all__ = [
    "test_a_request_at_the_processor_limit_may_still_carry_openai_fields",
    "test_frequency_penalty_is_transformers_repetition_penalty_per_request",
    "test_neighbours_sampling_fields_do_not_reach_a_greedy_request",
    "test_presence_penalty_and_logit_bias_reach_the_request",
    "test_stop_ends_the_request",
]


def fields_complete(client: Any, **fields: Any) -> list[int]:
    """The new token ids of the counting prompt with OpenAI ``fields`` (greedy unless
    they say otherwise)."""
    request = {"temperature": 0.0, "max_tokens": NEW_TOKENS, **fields}
    response = client.completions.create(
        model=client.served_model, prompt=COUNTING, extra_body=_extra_body(client, []), **request
    )
    return list(response.choices[0].model_extra["token_ids"])


def test_presence_penalty_and_logit_bias_reach_the_request(
    client: Any, counting: list[int], plain: list[int], reference: TransformersEngine
) -> None:
    penalized = fields_complete(client, presence_penalty=2.0)
    expected = reference.greedy(counting, [PresencePenalty(2.0)])
    assert expected != plain
    assert penalized == expected
    biased = fields_complete(client, logit_bias={str(plain[0]): -100})
    assert biased == reference.greedy(counting, [LogitBias({plain[0]: -100.0})]) != plain


def test_frequency_penalty_is_transformers_repetition_penalty_per_request(
    client: Any, counting: list[int], plain: list[int], reference: TransformersEngine
) -> None:
    # transformers serve maps it to generate's repetition_penalty = 1 + frequency_penalty.
    tokens = fields_complete(client, frequency_penalty=0.8)
    expected = reference.greedy(counting, [RepetitionPenalty(1.8)])
    assert expected != plain
    assert tokens == expected
    assert fields_complete(client) == plain  # the next request is its own


def test_stop_ends_the_request(client: Any, plain: list[int], engine: GenerationEngine) -> None:
    stop = engine.tokenizer.decode(plain[3:5])
    tokens = fields_complete(client, stop=[stop])
    assert 4 <= len(tokens) < len(plain), tokens
    assert engine.tokenizer.decode(tokens).rstrip().endswith(stop) or tokens[-1] in (
        engine.vocabulary.eos_token_ids
    )
    assert tokens[:4] == plain[:4]


def test_neighbours_sampling_fields_do_not_reach_a_greedy_request(
    client: Any, plain: list[int]
) -> None:
    """Requests that sample hot, penalize or bias beside greedy ones (on continuous
    batching, transformers would run every request with the first one's config)."""
    neighbours = [
        {"temperature": 1.8, "top_p": 0.5, "seed": 3},
        {},
        {"presence_penalty": 2.0},
        {"temperature": 1.5},
        {},
    ]
    with ThreadPoolExecutor(max_workers=len(neighbours)) as pool:
        futures = [pool.submit(fields_complete, client, **fields) for fields in neighbours]
        outputs = [future.result() for future in futures]
    assert outputs[1] == outputs[4] == plain
    assert outputs[2] != plain


def test_a_request_at_the_processor_limit_may_still_carry_openai_fields(
    client: Any, counting: list[int], reference: TransformersEngine
) -> None:
    """The processors anylogits makes of a request's own fields (and, on continuous
    batching, of its generation config) are not the client's specs: the limit on those
    holds for what the client sent."""
    limit = Limits().processors
    own = [TopK(1000 + index) for index in range(limit)]
    response = client.completions.create(
        model=client.served_model,
        prompt=COUNTING,
        max_tokens=NEW_TOKENS,
        temperature=0.0,
        presence_penalty=2.0,
        frequency_penalty=0.5,
        extra_body={**_extra_body(client, []), "vllm_xargs": {"anylogits": to_specs(own)}},
    )
    tokens = list(response.choices[0].model_extra["token_ids"])
    expected = [RepetitionPenalty(1.5), PresencePenalty(2.0), *own]
    assert tokens == reference.greedy(counting, expected)
