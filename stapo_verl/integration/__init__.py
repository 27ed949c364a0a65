"""The only code that touches verl's private API. One subpackage per verl release the plugin backports to
(:mod:`.verl_0_9_1`), each with its ledger of patches and its install-time version gate."""


def install() -> None:
    """Gate and install the integration for the installed verl (:func:`stapo_verl.integration.verl_0_9_1.install`).

    Raises:
        stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: the installed verl is not the supported one.
    """
    from stapo_verl.integration import verl_0_9_1

    verl_0_9_1.install()
