"""The sequence tracker: extend, fork, roll back, resume, free, and per-step cost."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anylogits import MinNewTokens, Pipeline
from anylogits.core.tracker import SequenceTracker
from test_support.probes import (
    GeneratedHashBias,
    GeneratedHashBiasRecompute,
    generated_hash,
)


def states_of(tracker: SequenceTracker, rows: list[list[int]]) -> list[int]:
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in rows])
    return [node.states[0] for node in tracker.locate(ids, lengths)]


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """Wrap ``owner.name`` so that every call appends to the returned list."""
    calls: list[int] = []
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.fixture
def probe() -> GeneratedHashBias:
    return GeneratedHashBias()


def test_extend_by_one_advances_the_parent_state(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe])
    states_of(tracker, [[1, 2, 3]])
    assert probe.init_calls == 1
    assert states_of(tracker, [[1, 2, 3, 4]]) == [generated_hash([4])]
    assert (probe.init_calls, probe.advance_calls) == (1, 1)


def test_beam_reordering_and_forking_follow_the_prefix(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe])
    states_of(tracker, [[5, 6], [5, 7]])
    # Rows swap places and the second sequence forks into two beams.
    rows = [[5, 7, 1], [5, 7, 2], [5, 6, 3]]
    assert states_of(tracker, rows) == [
        generated_hash([1]),
        generated_hash([2]),
        generated_hash([3]),
    ]
    assert probe.init_calls == 2


def test_rollback_of_rejected_draft_tokens_is_a_lookup(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe])
    prompt = [3, 1, 4]
    states_of(tracker, [prompt])
    for draft in ([1], [1, 5], [1, 5, 9]):  # assisted generation: one call per candidate
        states_of(tracker, [prompt + draft])
    advances = probe.advance_calls
    # Draft token 5 rejected: the target model resampled 2 after [.., 1].
    assert states_of(tracker, [[*prompt, 1, 2]]) == [generated_hash([1, 2])]
    assert probe.advance_calls == advances + 1
    assert probe.init_calls == 1


def test_decoding_again_over_a_rolled_back_prefix_reuses_its_nodes(
    probe: GeneratedHashBias,
) -> None:
    tracker = SequenceTracker([probe])
    for row in ([3], [3, 1], [3, 1, 4], [3, 1, 4, 1]):
        tracker.locate(torch.tensor([row]))
    advances = probe.advance_calls
    # Rolled back two tokens (a lookup), then the same two tokens decoded again (calls
    # that extend the last): each finds the node it made the first time.
    for row in ([3, 1], [3, 1, 4], [3, 1, 4, 1]):
        [node] = tracker.locate(torch.tensor([row]))
        assert node.states[0] == generated_hash(row[1:])
    assert probe.advance_calls == advances


def test_several_tokens_at_once_replay_from_the_longest_known_prefix(
    probe: GeneratedHashBias,
) -> None:
    tracker = SequenceTracker([probe])
    states_of(tracker, [[1, 2]])
    assert states_of(tracker, [[1, 2, 3, 4, 5]]) == [generated_hash([3, 4, 5])]
    assert (probe.init_calls, probe.advance_calls) == (1, 3)
    # The intermediate prefixes were stored: going back to [1, 2, 3, 4] costs nothing.
    assert states_of(tracker, [[1, 2, 3, 4]]) == [generated_hash([3, 4])]
    assert probe.advance_calls == 3


def test_resume_keeps_the_prompt_length_of_the_original_sequence() -> None:
    pipeline = Pipeline([MinNewTokens(3, eos_token_id=0)])
    logits = torch.zeros(1, 4)
    pipeline(logits.clone(), torch.tensor([[1, 2]]))
    pipeline(logits.clone(), torch.tensor([[1, 2, 3]]))
    # A later call continues the text with two more tokens: 3 generated in all.
    out = pipeline(logits.clone(), torch.tensor([[1, 2, 3, 3, 3]]))
    assert out[0, 0] == 0  # EOS allowed again
    fresh = pipeline(logits.clone(), torch.tensor([[9, 9, 9, 9, 9]]))
    assert fresh[0, 0] == float("-inf")  # an unrelated prompt starts from zero


def test_unknown_rows_start_new_sequences_with_the_whole_row_as_prompt(
    probe: GeneratedHashBias,
) -> None:
    tracker = SequenceTracker([probe])
    nodes = tracker.locate(torch.tensor([[4, 4, 4]]))
    assert (nodes[0].length, nodes[0].prompt_length) == (3, 3)


def test_ragged_right_aligned_rows_hash_like_full_rows(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe])
    states_of(tracker, [[1, 2, 3], [7]])
    rows = [[1, 2, 3, 4], [7, 8]]
    assert states_of(tracker, rows) == [generated_hash([4]), generated_hash([8])]
    assert probe.init_calls == 2


def test_finished_sequences_are_freed(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe], max_idle_calls=4)
    for request in range(50):  # 50 unrelated requests of 10 steps each
        row = [100 + request]
        for token in range(10):
            row.append(token)
            states_of(tracker, [row])
    assert len(tracker) <= 4 * 2  # a bounded window, not 50 * 11 nodes


def test_finished_sequences_decoded_call_after_call_are_freed(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe], max_idle_calls=4)
    for request in range(50):  # each call extends the last: nodes kept unregistered
        row = [100 + request]
        for token in range(10):
            row.append(token)
            tracker.locate(torch.tensor([row]))
    assert len(tracker) <= 4 * 2


def test_per_step_python_work_does_not_grow_with_length(
    probe: GeneratedHashBias, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = SequenceTracker([probe])
    slow_paths = count_calls(monkeypatch, tracker, "_from_longest_known_prefix")
    ids = torch.randint(0, 50_000, (4, 4096))
    tracker.locate(ids)
    assert len(slow_paths) == 4  # the prompts
    for _ in range(20):
        ids = torch.cat([ids, torch.randint(0, 50_000, (4, 1))], 1)
        tracker.locate(ids)
    # Steady decoding: one O(1) advance per row per step, never a replay.
    assert len(slow_paths) == 4
    assert probe.advance_calls == 4 * 20
    assert probe.init_calls == 4


def test_stateful_probe_equals_its_stateless_twin_under_shuffled_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    stateful = Pipeline([GeneratedHashBias()])
    stateless = Pipeline([GeneratedHashBiasRecompute(prompt_length=5)])
    ids = torch.randint(0, 100, (6, 5), generator=generator)
    for _ in range(10):
        logits = torch.randn(6, 100, generator=generator)
        assert torch.equal(stateful(logits.clone(), ids), stateless(logits.clone(), ids))
        parents = torch.randint(0, 6, (6,), generator=generator)  # beams fork and die
        ids = torch.cat([ids[parents], torch.randint(0, 100, (6, 1), generator=generator)], 1)
    assert torch.equal(stateful(logits.clone(), ids), stateless(logits.clone(), ids))


def test_token_ids_out_of_range_are_rejected(probe: GeneratedHashBias) -> None:
    with pytest.raises(ValueError, match="token ids must lie"):
        SequenceTracker([probe]).locate(torch.tensor([[-1, 2]]))


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("bad_id", [-1, 1 << 21])
def test_a_decoding_step_s_token_out_of_range_is_rejected(
    probe: GeneratedHashBias, rows: int, bad_id: int
) -> None:
    """The step that extends the last call by one token checks that token too."""
    tracker = SequenceTracker([probe])
    prompt = torch.arange(rows * 3).reshape(rows, 3)
    tracker.locate(prompt)
    step = torch.cat([prompt, torch.full((rows, 1), bad_id)], 1)
    with pytest.raises(ValueError, match="token ids must lie"):
        tracker.locate(step)


def test_max_idle_calls_is_validated(probe: GeneratedHashBias) -> None:
    with pytest.raises(ValueError, match="max_idle_calls must be >= 1, got 0"):
        SequenceTracker([probe], max_idle_calls=0)


def test_a_reused_caller_buffer_is_not_mistaken_for_an_extension(probe: GeneratedHashBias) -> None:
    # llama-cpp-python hands out slices of one growing buffer; a new prompt overwrites it.
    tracker = SequenceTracker([probe])
    buffer = torch.tensor([[1, 2, 3, 0, 0, 0]])
    tracker.locate(buffer[:, :3])
    buffer[0, :4] = torch.tensor([7, 8, 9, 4])  # an unrelated prompt, one token longer
    node = tracker.locate(buffer[:, :4])[0]
    assert (node.length, node.prompt_length) == (4, 4)
    assert probe.init_calls == 2


def test_plain_decoding_extends_without_hashing_the_history(
    probe: GeneratedHashBias, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = SequenceTracker([probe])
    ids = torch.randint(0, 1000, (3, 50))
    tracker.locate(ids)
    fast_calls = count_calls(monkeypatch, tracker, "_extend_last_call")
    generated = [[] for _ in range(3)]
    for _ in range(5):
        new = torch.randint(0, 1000, (3, 1))
        for row, token in enumerate(new[:, 0].tolist()):
            generated[row].append(token)
        ids = torch.cat([ids, new], 1)
        states = [node.states[0] for node in tracker.locate(ids)]
        assert states == [generated_hash(tokens) for tokens in generated]
    assert len(fast_calls) == 5 and probe.advance_calls == 15
    # The hashes kept on the fast path are the real ones: a reordered call still finds them.
    nodes = tracker.locate(ids[[2, 0, 1]])
    assert [node.states[0] for node in nodes] == [
        generated_hash(generated[2]),
        generated_hash(generated[0]),
        generated_hash(generated[1]),
    ]
    assert probe.advance_calls == 15 and probe.init_calls == 3


def test_a_tracker_finds_its_sequences_after_another_grew_the_shared_weights(
    probe: GeneratedHashBias,
) -> None:
    # Trackers of one seed share their hash weights (drawn once per process, not per
    # hook); another tracker growing them must not change the hashes this one stored.
    tracker = SequenceTracker([probe])
    states_of(tracker, [[1, 2, 3], [4, 5, 6]])
    other = SequenceTracker([GeneratedHashBias()])
    states_of(other, [list(range(1, 2000))])
    # Rows swapped: the parents are found by hashing, not by extending the last call.
    assert states_of(tracker, [[4, 5, 6, 7], [1, 2, 3, 8]]) == [
        generated_hash([7]),
        generated_hash([8]),
    ]
    assert probe.init_calls == 2


def test_a_sequence_longer_than_the_hashes_allow_is_refused(
    probe: GeneratedHashBias, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anylogits.core.tracker as tracker_module

    monkeypatch.setattr(tracker_module, "_MAX_LENGTH", 300)
    # A seed of its own: weights no other test has grown past this limit.
    tracker = SequenceTracker([probe], seed=300)
    tracker.locate(torch.arange(1, 201)[None])  # 256 weights drawn
    row = torch.arange(1, 258)[None]
    tracker.locate(row)  # grown by doubling, to the limit and not past it
    while row.shape[1] < 300:
        row = torch.cat([row, torch.tensor([[7]])], 1)
        tracker.locate(row)
    with pytest.raises(ValueError, match="longer than 300 tokens"):
        tracker.locate(torch.cat([row, torch.tensor([[7]])], 1))  # extends the last call


def test_a_prefix_hashed_in_python_is_found_by_a_batch_hashed_in_torch(
    probe: GeneratedHashBias,
) -> None:
    tracker = SequenceTracker([probe])
    states_of_full = tracker.locate(torch.tensor([[1, 2, 3]]))  # a few tokens: Python ints
    assert [node.states[0] for node in states_of_full] == [generated_hash([])]
    # 100 rows of 4 (past the Python limit): one extends [1, 2, 3], in another row.
    rows = torch.arange(1000, 1400).reshape(100, 4)
    rows[57] = torch.tensor([1, 2, 3, 4])
    nodes = tracker.locate(rows)
    assert nodes[57].states[0] == generated_hash([4])
    assert probe.init_calls == 100  # [1, 2, 3] and 99 new prompts, not [1, 2, 3, 4]


@pytest.mark.parametrize(("batch", "changed_row"), [(1, 0), (3, 0), (3, 1), (3, 2)])
def test_a_call_that_changes_an_earlier_token_of_one_row_is_not_an_extension(
    probe: GeneratedHashBias, batch: int, changed_row: int
) -> None:
    tracker = SequenceTracker([probe])
    ids = torch.randint(0, 1000, (batch, 6))
    tracker.locate(ids)
    extended = torch.cat([ids, torch.arange(batch)[:, None]], 1)
    extended[changed_row, 2] += 1
    nodes = tracker.locate(extended)
    # The changed row is a new prompt; the others extend their sequence by one token.
    assert [node.prompt_length for node in nodes] == [
        7 if row == changed_row else 6 for row in range(batch)
    ]
    assert probe.init_calls == batch + 1 and probe.advance_calls == batch - 1


def test_a_strided_history_extends_like_a_contiguous_one(probe: GeneratedHashBias) -> None:
    tracker = SequenceTracker([probe])
    storage = torch.randint(0, 1000, (2, 40))
    tracker.locate(storage[:, 0:10:2])  # every other column: not contiguous
    node = tracker.locate(storage[:, 0:12:2])[1]
    assert (node.length, node.prompt_length) == (6, 5)
    assert node.states[0] == generated_hash([int(storage[1, 10])])
    assert probe.init_calls == 2 and probe.advance_calls == 2


# One call: every row gains a token ("step", a decoding step: the unkeyed fast path),
# beams fork from the last call's rows ("fork"), rows go back to the rows of a call at
# most `max_idle_calls - 1` calls ago plus a token ("rollback": rejected drafts), or gain
# several tokens at once ("drafts").
CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.lists(st.integers(0, 49), min_size=3, max_size=3)),
        st.tuples(
            st.just("fork"),
            st.lists(st.tuples(st.integers(0, 2), st.integers(0, 49)), min_size=3, max_size=3),
        ),
        st.tuples(st.just("rollback"), st.integers(1, 3), st.integers(0, 49)),
        st.tuples(st.just("drafts"), st.lists(st.integers(0, 49), min_size=2, max_size=3)),
    ),
    min_size=20,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(calls=CALLS, max_idle_calls=st.integers(4, 6))
def test_every_row_within_the_idle_window_keeps_its_sequence(
    calls: list[tuple], max_idle_calls: int
) -> None:
    # Every row descends from a row of the last `max_idle_calls - 1` calls, so none may be
    # taken for a new prompt: each state is the hash of what the row generated, while
    # the window frees everything older (steps keyed late, forks and rollbacks at once).
    probe = GeneratedHashBias()
    tracker = SequenceTracker([probe], max_idle_calls=max_idle_calls)
    prompt = 2
    rows = [[7, row] for row in range(3)]
    tracker.locate(torch.tensor(rows))  # the prompts
    history = [rows]
    for call in calls:
        kind = call[0]
        if kind == "step":
            rows = [[*row, token] for row, token in zip(rows, call[1], strict=True)]
        elif kind == "fork":
            rows = [[*rows[parent], token] for parent, token in call[1]]
        elif kind == "rollback":
            back = min(call[1], len(history), max_idle_calls - 1)
            rows = [[*row, call[2]] for row in history[-back]]
        else:
            rows = [row + call[1] for row in rows]
        nodes = tracker.locate(torch.tensor(rows))
        assert [node.states[0] for node in nodes] == [generated_hash(row[prompt:]) for row in rows]
        assert [node.prompt_length for node in nodes] == [prompt] * len(rows)
        history.append(rows)
    # A bounded window: at most the rows of the last calls, each with its parent and the
    # prefixes a call of drafts replays.
    assert len(tracker) <= 3 * 4 * max_idle_calls
