"""CPU backend for verl 0.9.1 (placeholder, being written)."""


def register():
    return None
