"""Start-up self-checks (placeholder, being written)."""


def install_validate_config_hook():
    return None
