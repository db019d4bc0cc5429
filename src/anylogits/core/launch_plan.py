"""A pipeline's processors as kernel launches, where a fused kernel covers a run of them.

On a CUDA device with kernels on (:func:`anylogits.kernels.kernels_enabled`), a run of
consecutive processors that one kernel applies together is replaced by one step that
launches it: the sampling chain's tail, top-k / top-p / min-p with the temperature
first or last (:mod:`anylogits.kernels.truncation`); the repetition penalty, and OpenAI's
presence and frequency penalties (:mod:`anylogits.kernels.penalties`); a logit bias with
suppressed tokens (:mod:`anylogits.kernels.sparse`). The plan knows a processor only by
the form it declares (:meth:`~anylogits.core.fast_paths.FastPaths.fused_form`, see
:mod:`anylogits.core.fused_forms`), catalogue or not. Every other processor runs as it
is, and off CUDA the plan is never used: the torch processors stay the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from anylogits.core import fast_paths
from anylogits.core.fast_paths import FastPaths
from anylogits.core.fused_forms import (
    FusedForm,
    OutputPenalty,
    OutputPenaltyKind,
    RepetitionPenaltyForm,
    TokenListKind,
    TokenLists,
    Truncation,
    TruncationKind,
)
from anylogits.core.processor import LogitsProcessor
from anylogits.core.transfer import DeviceCopies, to_device

if TYPE_CHECKING:
    from anylogits.core.batch import Batch
    from anylogits.kernels.sparse import RowLists

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_Form = TypeVar("_Form", Truncation, OutputPenalty, TokenLists)


def launch_plan(processors: Sequence[LogitsProcessor]) -> tuple[LogitsProcessor, ...] | None:
    """``processors`` with each run a kernel covers replaced by its fused step; ``None``
    when no run is covered (the plan would be the processors themselves)."""
    forms = [fast_paths.fused_form(processor) for processor in processors]
    plan: list[LogitsProcessor] = []
    index = 0
    fused = False
    while index < len(processors):
        step = _kernel_step(processors, forms, index)
        if step is None:
            plan.append(processors[index])
            index += 1
        else:
            plan.append(step)
            fused, index = True, index + len(step.processors)
    return tuple(plan) if fused else None


def _kernel_step(
    processors: Sequence[LogitsProcessor], forms: Sequence[FusedForm | None], start: int
) -> _KernelStep | None:
    """The step for the longest run from ``start`` that one kernel covers, or ``None``."""
    form = forms[start]
    if isinstance(form, Truncation):
        run = _run_of(forms[start:], Truncation, closing=TruncationKind.TEMPERATURE)
        # A temperature alone is no truncation: it runs as it is.
        if all(step.kind == TruncationKind.TEMPERATURE for step in run):
            return None
        return FusedTruncation(processors[start : start + len(run)], run)
    if isinstance(form, RepetitionPenaltyForm):
        return FusedRepetitionPenalty(processors[start], form)
    if isinstance(form, OutputPenalty):
        penalties = _run_of(forms[start:], OutputPenalty)
        return FusedOutputPenalties(processors[start : start + len(penalties)], penalties)
    if isinstance(form, TokenLists):
        lists = _run_of(forms[start:], TokenLists)
        return FusedBiasAndBans(processors[start : start + len(lists)], lists)
    return None


def _run_of(
    forms: Sequence[FusedForm | None], form_type: type[_Form], closing: Any = None
) -> list[_Form]:
    """``forms`` from the first on, up to one not of ``form_type`` (another kernel's, or
    none) or of a kind already in the run: each kind once. ``closing``: a kind that ends
    the run after it when it is not the first."""
    run: list[_Form] = []
    for form in forms:
        if not isinstance(form, form_type) or any(form.kind == seen.kind for seen in run):
            break
        run.append(form)
        if form.kind == closing and len(run) > 1:
            break
    return run


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

    def __init__(self, processors: Sequence[LogitsProcessor], forms: Sequence[Truncation]) -> None:
        self.processors = tuple(processors)
        kinds = [form.kind for form in forms]
        # Per kind: a value for every row, or a DeviceCopies of one per row (stacked); a
        # kind absent keeps every token (a temperature of 1 divides by 1).
        self.values = dict(_NEUTRAL_VALUES)
        self.values.update((form.kind, form.value) for form in forms)
        order = {kind: position for position, kind in enumerate(kinds)}
        p_at = order.get(TruncationKind.TOP_P, len(kinds))
        self.k_before_p = order.get(TruncationKind.TOP_K, len(kinds)) < p_at
        self.min_p_before_p = order.get(TruncationKind.MIN_P, len(kinds)) < p_at
        self.temperature_first = kinds[0] == TruncationKind.TEMPERATURE
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
        once, in :func:`~anylogits.kernels.truncation.truncate`'s order."""
        parameters = self._parameters.get(device)
        if parameters is None:
            made = []
            for kind, dtype in _PARAMETER_DTYPES.items():
                value = self.values[kind]
                if isinstance(value, DeviceCopies):
                    made.append(value.on(device, dtype))
                else:
                    made.append(to_device(torch.tensor([value], dtype=dtype), device))
            parameters = self._parameters[device] = tuple(made)
        return parameters


_NEUTRAL_VALUES: dict[TruncationKind, int | float | DeviceCopies] = {
    TruncationKind.TOP_K: 0,
    TruncationKind.TOP_P: 1.0,
    TruncationKind.MIN_P: 0.0,
    TruncationKind.TEMPERATURE: 1.0,
}
_PARAMETER_DTYPES = {
    TruncationKind.TOP_K: torch.int64,
    TruncationKind.TOP_P: torch.float32,
    TruncationKind.MIN_P: torch.float32,
    TruncationKind.TEMPERATURE: torch.float32,
}


class FusedRepetitionPenalty(_KernelStep):
    """CTRL's repetition penalty (:class:`~anylogits.core.fused_forms.RepetitionPenaltyForm`)
    as one launch on CUDA for full rows whose history is on the logits' device
    (transformers' ``input_ids``); the processor itself anywhere else (ragged rows, host
    histories)."""

    def __init__(self, processor: LogitsProcessor, form: RepetitionPenaltyForm) -> None:
        self.processors = (processor,)
        self.penalty, self.context_size = form.penalty, form.context_size
        self._parameters: dict[torch.device, torch.Tensor] = {}

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        ids = batch.token_ids if batch.rows_are_full else None
        if ids is None or ids.device != logits.device:
            return None
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

    def __init__(
        self, processors: Sequence[LogitsProcessor], forms: Sequence[OutputPenalty]
    ) -> None:
        self.processors = tuple(processors)
        self.kinds = [form.kind for form in forms]
        # Each kind's per-row penalties (one value for every row unless stacked).
        self.values = {form.kind: form.penalties for form in forms}

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
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
            presence=penalties.get(OutputPenaltyKind.PRESENCE),
            frequency=penalties.get(OutputPenaltyKind.FREQUENCY),
            presence_first=self.kinds[0] == OutputPenaltyKind.PRESENCE,
            out=out,
        )


# An empty list for a kind the step lacks (offsets 0 and 0; one id and value slot, never
# read), copied to a device (and a dtype) once.
_NO_IDS = DeviceCopies(torch.zeros(1, dtype=torch.int64))
_NO_OFFSETS = DeviceCopies(torch.zeros(2, dtype=torch.int64))
_NO_VALUES = DeviceCopies(torch.zeros(1, dtype=torch.float32))


class FusedBiasAndBans(_KernelStep):
    """A logit bias and suppressed tokens (one of each at most, stacked rows included,
    in either order: a ban wins over a bias either way) as one launch on CUDA; the
    processors one after another anywhere else."""

    def __init__(self, processors: Sequence[LogitsProcessor], forms: Sequence[TokenLists]) -> None:
        self.processors = tuple(processors)
        self.kinds = {form.kind: form for form in forms}

    def launch(
        self, logits: torch.Tensor, batch: Batch, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        from anylogits.kernels.sparse import RowLists, bias_and_bans

        bias = self._lists(TokenListKind.BIAS, logits)
        bans = self._lists(TokenListKind.BANS, logits)
        if bias is None or bans is None:
            ids, offsets = _NO_IDS.on(logits.device), _NO_OFFSETS.on(logits.device)
            bias = bias or RowLists(ids, offsets, _NO_VALUES.on(logits.device, logits.dtype))
            bans = bans or RowLists(ids, offsets)
        return bias_and_bans(logits, bias=bias, bans=bans, out=logits if out is None else out)

    def _lists(self, kind: TokenListKind, logits: torch.Tensor) -> RowLists | None:
        """``kind``'s ids (and values) in CSR form on the logits' device, or ``None``
        (none, or no id in any row); an id past the row raises the processor's
        ``ValueError``."""
        from anylogits.kernels.sparse import RowLists

        form = self.kinds.get(kind)
        if form is None:
            return None
        ids = form.ids(logits)
        if ids.numel() == 0:
            return None
        values = None if form.values is None else form.values.on(logits.device, logits.dtype)
        return RowLists(ids, form.offsets.on(logits.device), values)
