"""Worker hooks (placeholder, being written)."""


def install():
    return None
