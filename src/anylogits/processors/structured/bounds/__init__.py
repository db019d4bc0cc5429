"""What a structured spec may cost, read from its text before the engine compiles it.

- ``counts``: every number a client controls inside a schema, regex or grammar that is a
  cost by a rule measured or found by the fuzzer (``maxItems`` allocations, nested counted
  repetitions, ``multipleOf``, Lark's embedded specs).
- ``greedy_lexing``: Lark grammars whose greedy lexer would force one byte forever (a
  stall no budget of the engine charges), on the token shapes of ``token_shapes``.

What these rules do not cover, the compile budget of :mod:`..guard` and llguidance's own
limits do.
"""
