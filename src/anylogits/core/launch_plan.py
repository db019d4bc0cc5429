"""A pipeline's processors as kernel launches, where a fused kernel covers a run of them.

On a CUDA device with kernels on (:func:`anylogits.kernels.kernels_enabled`), a run of
consecutive processors that one kernel applies together is replaced by one step that
launches it: the sampling chain's tail, top-k / top-p / min-p with the temperature
first or last (:mod:`anylogits.kernels.truncation`); the repetition penalty and OpenAI's
presence and frequency penalties (:mod:`anylogits.kernels.penalties`); a logit bias with
suppressed tokens (:mod:`anylogits.kernels.sparse`). Every other processor runs as it
is, and off CUDA the plan is never used: the torch processors stay the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from anylogits.core import fast_paths
from anylogits.core.fast_paths import FastPaths, RowwiseProcessor
from anylogits.core.processor import LogitsProcessor

if TYPE_CHECKING:
    from anylogits.core.batch import Batch

_TRUNCATIONS = frozenset({"top_k", "top_p", "min_p"})
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def launch_plan(processors: Sequence[LogitsProcessor]) -> tuple[LogitsProcessor, ...] | None:
    """``processors`` with each run a kernel covers replaced by its fused step; ``None``
    when no run is covered (the plan would be the processors themselves)."""
    plan: list[LogitsProcessor] = []
    index = 0
    fused = False
    while index < len(processors):
        end = _covered_run_end(processors, index)
        if end > index:
            plan.append(FusedTruncation(processors[index:end]))
            fused, index = True, end
        elif type(processors[index]).spec_name == "repetition_penalty":
            plan.append(FusedRepetitionPenalty(processors[index]))
            fused, index = True, index + 1
        elif _output_penalty(processors[index]) is not None:
            end = _output_penalties_end(processors, index)
            plan.append(FusedOutputPenalties(processors[index:end]))
            fused, index = True, end
        elif _bias_or_bans(processors[index]) is not None:
            end = index + len(_distinct_kinds(processors[index:], _bias_or_bans))
            plan.append(FusedBiasAndBans(processors[index:end]))
            fused, index = True, end
        else:
            plan.append(processors[index])
            index += 1
    return tuple(plan) if fused else None


def _fusable(processor: LogitsProcessor) -> str | None:
    """The kind the truncation kernel applies ``processor`` as, or ``None``: the catalogue
    processor, or the rows of several stacked into one (vLLM's grouped requests)."""
    kind = type(processor).spec_name
    if kind in ("temperature", "top_k"):
        return kind
    if kind in ("top_p", "min_p") and processor.config().get("min_tokens_to_keep") == 1:
        return kind
    if isinstance(processor, RowwiseProcessor):
        stacked = _stacked_kinds().get(processor.function)
        if stacked is not None and processor.parameters.get("min_tokens_to_keep", 1) == 1:
            return stacked[0]
    return None


def _output_penalty(processor: LogitsProcessor) -> str | None:
    """``"presence"`` / ``"frequency"`` for OpenAI's penalties (stacked rows included),
    else ``None``."""
    kind = type(processor).spec_name
    if kind in ("presence_penalty", "frequency_penalty"):
        return kind.split("_")[0]
    if isinstance(processor, RowwiseProcessor):
        return _stacked_output_penalties().get(processor.function)
    return None


def _bias_or_bans(processor: LogitsProcessor) -> str | None:
    """``"bias"`` for a logit bias, ``"bans"`` for suppressed tokens (stacked rows
    included), else ``None``."""
    kind = type(processor).spec_name
    if kind in ("logit_bias", "suppress_tokens"):
        return "bias" if kind == "logit_bias" else "bans"
    if isinstance(processor, RowwiseProcessor):
        return _stacked_bias_and_bans().get(processor.function)
    return None


def _output_penalties_end(processors: Sequence[LogitsProcessor], start: int) -> int:
    """The end of the run of OpenAI's penalties from ``start``, each kind once."""
    return start + len(_distinct_kinds(processors[start:], _output_penalty))


def _distinct_kinds(
    processors: Sequence[LogitsProcessor],
    kind_of: Callable[[LogitsProcessor], str | None],
    closing: str | None = None,
) -> list[str]:
    """The kinds of ``processors`` from the first on, up to one a kernel does not take
    (``kind_of`` gives ``None``) or one already seen; ``closing``: a kind that ends the
    run after it when it is not the first."""
    kinds: list[str] = []
    for processor in processors:
        kind = kind_of(processor)
        if kind is None or kind in kinds:
            break
        kinds.append(kind)
        if kind == closing and len(kinds) > 1:
            break
    return kinds


@functools.cache
def _stacked_kinds() -> dict[Any, tuple[str, str]]:
    """The stacked rows' functions the truncation kernel covers: kind, and the per-row
    parameter (imported on first use: the processors import the core)."""
    from anylogits.processors._ops import divide_rows
    from anylogits.processors.truncation import _min_p_rows, _top_k_rows

    return {
        _top_k_rows: ("top_k", "ks"),
        _min_p_rows: ("min_p", "min_ps"),
        divide_rows: ("temperature", "divisors"),
    }


@functools.cache
def _stacked_output_penalties() -> dict[Any, str]:
    """The stacked rows' functions of OpenAI's penalties, by kind."""
    from anylogits.processors.penalties import _frequency_penalty, _presence_penalty

    return {_presence_penalty: "presence", _frequency_penalty: "frequency"}


@functools.cache
def _stacked_bias_and_bans() -> dict[Any, str]:
    """The stacked rows' functions of logit biases and suppressed tokens, by kind."""
    from anylogits.processors._ops import add_rows, suppress_rows

    return {add_rows: "bias", suppress_rows: "bans"}


def _covered_run_end(processors: Sequence[LogitsProcessor], start: int) -> int:
    """The end of the longest run from ``start`` the truncation kernel covers (``start``
    when none): each kind at most once, at least one truncation, the temperature only
    first or last (a temperature after truncations ends the run)."""
    kinds = _distinct_kinds(processors[start:], _fusable, closing="temperature")
    return start + len(kinds) if _TRUNCATIONS & set(kinds) else start


class _KernelStep(FastPaths):
    """A step of the plan: its processors as one kernel launch where :meth:`launch`
    can (it returns ``None`` where it cannot), else one after another."""

    processors: tuple[LogitsProcessor, ...]

    def config(self) -> dict[str, Any]:
        return {"processors": [repr(p) for p in self.processors]}

    def process(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self._run(logits, batch, None)

    def process_into(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor) -> torch.Tensor:
        return self._run(logits, batch, out)

    def _run(self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None) -> torch.Tensor:
        from anylogits.kernels import kernels_enabled

        if logits.dtype in _FUSED_DTYPES and kernels_enabled(logits.device):
            launched = self.launch(logits, batch, out)
            if launched is not None:
                return launched
        if out is not None:
            logits = fast_paths.process_into(self.processors[0], logits, batch, out)
        else:
            logits = self.processors[0].process(logits, batch)
        for processor in self.processors[1:]:
            logits = processor.process(logits, batch)
        return logits

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The result of the kernel (into ``out`` when given), or ``None`` when these
        rows are not the kernel's (the processors then run)."""
        raise NotImplementedError


class FusedTruncation(_KernelStep):
    """Top-k, top-p, min-p and a temperature, in the order given, as one kernel launch
    on CUDA (the processors one after another anywhere else)."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = tuple(processors)
        kinds = [_fusable(p) for p in self.processors]
        # Per kind: a value for every row, or a DeviceCopies of one per row (stacked).
        values: dict[str | None, Any] = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
        values["temperature"] = 1.0
        for kind, processor in zip(kinds, self.processors, strict=True):
            if isinstance(processor, RowwiseProcessor):
                values[kind] = processor.parameters[_stacked_kinds()[processor.function][1]]
            elif kind == "top_k":
                config = processor.config()
                values[kind] = max(config["top_k"], config["min_tokens_to_keep"])
            else:
                values[kind] = processor.config()[str(kind)]
        self.values = values
        order = {kind: position for position, kind in enumerate(kinds)}
        p_at = order.get("top_p", len(kinds))
        self.k_before_p = order.get("top_k", len(kinds)) < p_at
        self.min_p_before_p = order.get("min_p", len(kinds)) < p_at
        self.temperature_first = kinds[0] == "temperature"
        self._parameters: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        from anylogits.kernels.truncation import truncate

        top_k, top_p, min_p, temperature = self._on(logits.device)
        return truncate(
            logits,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            temperature=temperature,
            k_before_p=self.k_before_p,
            min_p_before_p=self.min_p_before_p,
            temperature_first=self.temperature_first,
            out=logits if out is None else out,
        )

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The parameters on ``device`` (one-element tensors, or one value a row), made
        once."""
        parameters = self._parameters.get(device)
        if parameters is None:
            from anylogits.core.transfer import DeviceCopies, to_device

            made = []
            for kind, dtype in _PARAMETER_DTYPES.items():
                value = self.values[kind]
                if isinstance(value, DeviceCopies):
                    made.append(value.on(device, dtype))
                else:
                    made.append(to_device(torch.tensor([value], dtype=dtype), device))
            parameters = self._parameters[device] = tuple(made)
        return parameters


_PARAMETER_DTYPES = {
    "top_k": torch.int64,
    "top_p": torch.float32,
    "min_p": torch.float32,
    "temperature": torch.float32,
}


class FusedRepetitionPenalty(_KernelStep):
    """A :class:`~anylogits.RepetitionPenalty` as one launch on CUDA for full rows whose
    history is on the logits' device (transformers' ``input_ids``); the processor itself
    anywhere else (ragged rows, host histories)."""

    def __init__(self, processor: LogitsProcessor) -> None:
        self.processors = (processor,)
        config = processor.config()
        self.penalty, self.context_size = config["penalty"], config["context_size"]
        self._parameters: dict[torch.device, torch.Tensor] = {}

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        ids = batch.token_ids if batch.rows_are_full else None
        if ids is None or ids.device != logits.device:
            return None
        from anylogits.core.transfer import to_device
        from anylogits.kernels.penalties import repetition_penalty

        if self.context_size is not None:
            ids = ids[:, -self.context_size :]
        penalty = self._parameters.get(logits.device)
        if penalty is None:
            host = torch.tensor([self.penalty], dtype=torch.float32)
            penalty = self._parameters[logits.device] = to_device(host, logits.device)
        return repetition_penalty(logits, ids, penalty, out=out)


class FusedOutputPenalties(_KernelStep):
    """OpenAI's presence and frequency penalties (one of each at most, in the order
    given) as one launch on CUDA (a host history copied there without blocking); the
    processors one after another anywhere else."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = tuple(processors)
        self.kinds = [_output_penalty(p) for p in self.processors]
        # Each processor's per-row penalties (one value for every row unless stacked).
        self.values = {
            kind: (p.parameters["penalty"] if isinstance(p, RowwiseProcessor) else p._penalties)  # type: ignore[attr-defined]
            for kind, p in zip(self.kinds, self.processors, strict=True)
        }

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        from anylogits.core.transfer import to_device
        from anylogits.kernels.penalties import output_penalties

        ids = to_device(batch.token_ids, logits.device)
        generated = to_device(batch.generated_lengths, logits.device)
        penalties = {
            kind: values.on(logits.device, torch.float32) for kind, values in self.values.items()
        }
        return output_penalties(
            logits,
            ids,
            generated,
            presence=penalties.get("presence"),
            frequency=penalties.get("frequency"),
            presence_first=self.kinds[0] == "presence",
            out=out,
        )


class FusedBiasAndBans(_KernelStep):
    """A logit bias and suppressed tokens (one of each at most, stacked rows included,
    in either order: a ban wins over a bias either way) as one launch on CUDA; the
    processors one after another anywhere else."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        from anylogits.core.transfer import DeviceCopies

        self.processors = tuple(processors)
        self.kinds = {_bias_or_bans(p): p for p in self.processors}
        # A processor's one list, shared by every row: offsets 0 and its length.
        self._shared_offsets = {
            kind: DeviceCopies(torch.tensor([0, len(p._columns.ids)], dtype=torch.int64))  # type: ignore[attr-defined]
            for kind, p in self.kinds.items()
            if not isinstance(p, RowwiseProcessor)
        }

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        from anylogits.kernels.sparse import bias_and_bans

        bias, bans = (self._lists(kind, logits) for kind in ("bias", "bans"))
        return bias_and_bans(logits, bias=bias, bans=bans, out=logits if out is None else out)

    def _lists(self, kind: str, logits: torch.Tensor) -> Any:
        """``kind``'s processor's ids (and values) in CSR form on the logits' device, or
        ``None``; an id past the row raises the processor's ``ValueError``."""
        from anylogits.kernels.sparse import RowLists

        processor = self.kinds.get(kind)
        if processor is None:
            return None
        values = None
        if isinstance(processor, RowwiseProcessor):
            index = processor.parameters["index"]
            _, ids = index.for_logits(logits)
            if ids.numel() == 0:
                return None
            if kind == "bias":
                values = index.values_for(logits)
            return RowLists(ids, index.offsets_on(logits.device), values)
        columns = processor._columns  # type: ignore[attr-defined]
        ids = columns.for_logits(logits)
        if ids.numel() == 0:
            return None
        if kind == "bias":
            values = processor._values.on(logits.device, logits.dtype)  # type: ignore[attr-defined]
        return RowLists(ids, self._shared_offsets[kind].on(logits.device), values)
