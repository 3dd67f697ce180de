"""Pure functions over memory text: the write policy (normalization, PII, injection), BM25's term
weights (lexical), the delimited block a prompt receives and how a tool call reads as text.
Nothing here imports another group of ``shared``."""
