"""The only code that touches verl's private API. One subpackage per verl release the plugin backports to
(:mod:`.verl_0_9_1`), each with its ledger of patches and its install-time version gate."""


def install() -> bool:
    """Gate and install the integration for the installed verl
    (:func:`stapo_verl.integration.verl_0_9_1.installer.install`).

    Returns:
        True if the integration is installed; False on a verl it was not written for (one warning line, nothing
        patched; a job asking for the plugin fails naming both versions).
    """
    from stapo_verl.integration.verl_0_9_1 import installer

    return installer.install()


def installed() -> bool:
    """Whether the integration is installed in this process (:func:`stapo_verl.integration.verl_0_9_1.installed`)."""
    from stapo_verl.integration import verl_0_9_1

    return verl_0_9_1.installed()


def check_verl(asked_by: str) -> None:
    """Raise unless the installed verl is the one the integration was written for, or the override is set
    (:func:`stapo_verl.integration.verl_0_9_1.check_verl`).

    Args:
        asked_by: what needs the integration, named first in the error (e.g. the config key and value).

    Raises:
        stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: the installed verl differs (a ``BaseException``);
            the message names both versions and ``STAPO_ALLOW_UNSUPPORTED_VERL=1``.
    """
    from stapo_verl.integration import verl_0_9_1

    verl_0_9_1.check_verl(asked_by)
