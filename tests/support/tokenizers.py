"""A stand-in tokenizer for tests and benchmarks that only need ``decode`` (the token dump's context windows)."""


class CountingTokenizer:
    """``decode(ids)`` → ``'t<id>'`` joined by spaces; counts the ids it decoded (what the dump's context windows
    cost, minus a real vocabulary)."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids):
        self.decoded += len(ids)
        return " ".join(f"t{i}" for i in ids)
