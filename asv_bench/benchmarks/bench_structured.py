"""5. Structured generation: per-token cost of ours against llguidance called directly
and against outlines' own JSON-schema logits processor.

All walk the same valid token path of a real MaskBench schema (Kubernetes kb_118) with
the llama-bpe vocabulary (V=128,256); every row of the batch follows the path, and the
cost is the mean over the path's tokens (forced keys and numbers are cheap, free-text
string positions are not); each row starts from its own token, so rows are distinct
sequences as in a real batch. Direct: llguidance's public torch path,
``fill_next_token_bitmask_par`` + ``apply_token_bitmask_inplace`` (a ``torch.compile``
kernel) + ``consume_token`` per row, every row a copy of one matcher compiled once (as
ours copies its cached compiled grammar). Ours: the processor through the transformers hook
(``for_transformers``), fed the growing ``(B, L)`` history as ``generate`` feeds it
(tracker included; the hook leaves transformers' logits untouched and returns new
ones). Outlines: its llguidance backend (``LLGuidanceBackend``, issue 17's comparison)
and its default ``OutlinesCoreBackend``, ``get_json_schema_logits_processor`` called with
the same torch tensors (index built in setup). Ratios take the best of
:data:`ROUNDS` interleaved walks of each side.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from . import common  # noqa: F401  (one torch thread, as every benchmark)

SCHEMA_FILE = (
    Path(__file__).resolve().parents[2]
    / "conformance_tests"
    / "data"
    / "maskbench-sample"
    / "Kubernetes---kb_118_Normalized.json"
)
PATH_TOKENS = 48
ROUNDS = 3


def _setup() -> tuple[Any, Any, dict, list[int]]:
    try:
        import llguidance  # noqa: F401
        import transformers
    except ImportError as error:
        raise NotImplementedError(f"needs transformers and llguidance: {error}") from None
    from anylogits.core.vocab import hf_vocabulary
    from anylogits.testing.tiny_model import build_tiny_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(build_tiny_model())
    case = json.loads(SCHEMA_FILE.read_text())
    instance = next(t["data"] for t in case["tests"] if t["valid"])
    path = tokenizer.encode(json.dumps(instance), add_special_tokens=False)[:PATH_TOKENS]
    return tokenizer, hf_vocabulary(tokenizer), case["schema"], path


def _all_allowed(logits: torch.Tensor) -> torch.Tensor:
    return torch.full((logits.shape[0], (logits.shape[1] + 31) // 32), -1, dtype=torch.int32)


class StructuredPerToken:
    """Seconds per generated token (median over the path), ours and llguidance direct."""

    params = ([1, 32],)
    param_names = ["batch"]
    timeout = 600

    def setup(self, batch: int) -> None:
        # The tokenizer stays referenced: the vocabulary holds it weakly.
        self.tokenizer, self.vocab, self.schema, self.path = _setup()
        self.batch = batch
        self.logits = torch.randn(batch, 128_256)
        self._template: Any = None  # the direct side's compiled matcher

    def ours(self) -> float:
        from anylogits import JSONSchema, for_transformers

        hook = for_transformers(JSONSchema(self.schema), tokenizer=self.tokenizer)
        return self._walk(lambda logits, ids: hook(ids, logits))

    def _walk(self, mask: Any) -> float:
        """Mean seconds per call of ``mask(logits, ids)`` (returning the masked logits)
        along the path; each call's mask must allow the path's next token, or the
        comparison would be void."""
        # A distinct first token per row: rows are different sequences, as in a real batch.
        ids = torch.arange(self.batch, dtype=torch.long)[:, None]
        times = []
        for index, token in enumerate(self.path):
            if index:
                ids = torch.cat([ids, torch.full((self.batch, 1), self.path[index - 1])], 1)
            logits = self.logits.clone()
            start = time.perf_counter()
            masked = mask(logits, ids)
            if index:  # the first call sets the sequence up, as creating matchers does
                times.append(time.perf_counter() - start)
            if not torch.isfinite(masked[0, token]):
                raise RuntimeError(f"token {index} of the path was refused: not comparable")
        return sum(times) / len(times)

    def direct(self) -> float:
        import llguidance
        import llguidance.torch as llg_torch

        from anylogits import JSONSchema
        from anylogits.processors.structured.engine import ENGINE

        grammar = JSONSchema(self.schema).grammar
        # llguidance's own apply compiles its kernel (torch.compile) on the first call.
        llg_torch.apply_token_bitmask_inplace(self.logits.clone(), _all_allowed(self.logits))
        tokenizer = ENGINE.tokenizer(self.vocab)  # type: ignore[attr-defined]
        # Compiled once and copied for every row and walk, as ours copies its compiled
        # grammar: copies share the lexer llguidance builds lazily, which 32 matchers
        # compiled apart would each build again.
        if self._template is None:
            self._template = llguidance.LLMatcher(tokenizer, grammar)
        matchers = [self._template.deep_copy() for _ in range(self.batch)]
        executor = llguidance.LLExecutor()
        bitmask = llg_torch.allocate_token_bitmask(self.batch, tokenizer.vocab_size)
        rows = list(enumerate(matchers))
        times = []
        for index, token in enumerate(self.path):
            logits = self.logits.clone()
            start = time.perf_counter()
            llg_torch.fill_next_token_bitmask_par(executor, [(m, i) for i, m in rows], bitmask)
            llg_torch.apply_token_bitmask_inplace(logits, bitmask)
            for matcher in matchers:
                matcher.consume_token(token)
            if index:  # timed over the same masks as the other two
                times.append(time.perf_counter() - start)
        return sum(times) / len(times)

    def outlines(self, backend: str = "llguidance") -> float:
        """Outlines' JSON-schema processor on ``backend`` ("llguidance" or "outlines_core")."""
        try:
            import outlines
            from outlines.backends.llguidance import LLGuidanceBackend
            from outlines.backends.outlines_core import OutlinesCoreBackend
        except ImportError as error:
            raise NotImplementedError(f"needs outlines: {error}") from None
        import transformers

        from anylogits.testing.tiny_model import build_tiny_model

        folder = build_tiny_model()
        model = outlines.from_transformers(
            transformers.AutoModelForCausalLM.from_pretrained(folder),
            transformers.AutoTokenizer.from_pretrained(folder),
        )
        backend_class = {"llguidance": LLGuidanceBackend, "outlines_core": OutlinesCoreBackend}
        processor = backend_class[backend](model).get_json_schema_logits_processor(
            json.dumps(self.schema)
        )
        # Its first call sets up guides and compiles its kernel (torch.compile): untimed.
        processor(torch.zeros(self.batch, 1, dtype=torch.long), self.logits.clone())
        processor.reset()
        return self._walk(lambda logits, ids: processor(ids, logits))

    def _best(self, *walks: Any) -> list[float]:
        """Best seconds per token of each walk over :data:`ROUNDS` interleaved rounds."""
        best = [float("inf")] * len(walks)
        for _ in range(ROUNDS):
            for index, walk in enumerate(walks):
                best[index] = min(best[index], walk())
        return best

    def track_ours_us(self, batch: int) -> float:
        return self.ours() * 1e6

    track_ours_us.unit = "us"

    def track_direct_us(self, batch: int) -> float:
        return self.direct() * 1e6

    track_direct_us.unit = "us"

    def track_ours_over_direct(self, batch: int) -> float:
        """Target (issue 17): <= 1.25 at B=1, <= 1.0 at B=32."""
        ours, direct = self._best(self.ours, self.direct)
        return ours / direct

    track_ours_over_direct.unit = "ratio"

    def track_outlines_us(self, batch: int) -> float:
        return self.outlines() * 1e6

    track_outlines_us.unit = "us"

    def track_outlines_over_ours(self, batch: int) -> float:
        """Outlines' llguidance backend over ours. Target (issue 17): > 1 (ours faster)."""
        outlines, ours = self._best(self.outlines, self.ours)
        return outlines / ours

    track_outlines_over_ours.unit = "ratio"

    def track_outlines_core_over_ours(self, batch: int) -> float:
        """Outlines' default backend (outlines-core) over ours."""
        outlines, ours = self._best(lambda: self.outlines("outlines_core"), self.ours)
        return outlines / ours

    track_outlines_core_over_ours.unit = "ratio"

    def track_outlines_over_direct(self, batch: int) -> float:
        """The ceiling of ``outlines_over_ours`` for any processor built on llguidance."""
        outlines, direct = self._best(self.outlines, self.direct)
        return outlines / direct

    track_outlines_over_direct.unit = "ratio"


class SchemaCompile:
    """Seconds to build and bind ``JSONSchema`` for each MaskBench schema that compiles."""

    timeout = 600

    def setup(self) -> None:
        self.tokenizer, self.vocab, _, _ = _setup()
        folder = SCHEMA_FILE.parent
        self.schemas = [json.loads(p.read_text())["schema"] for p in sorted(folder.glob("*.json"))]

    def track_compile_ms_per_schema(self) -> float:
        from anylogits import JSONSchema
        from anylogits.processors.structured.engine import COMPILED

        COMPILED.clear()
        compiled, start = 0, time.perf_counter()
        for schema in self.schemas:
            try:
                JSONSchema(schema).bind(self.vocab)
            except ValueError:
                continue
            compiled += 1
        return (time.perf_counter() - start) / compiled * 1e3

    track_compile_ms_per_schema.unit = "ms"

    def track_coverage(self) -> float:
        from anylogits import JSONSchema

        compiled = 0
        for schema in self.schemas:
            try:
                JSONSchema(schema).bind(self.vocab)
            except ValueError:
                continue
            compiled += 1
        return float(compiled)

    track_coverage.unit = "schemas"
