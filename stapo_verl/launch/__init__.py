"""What the recipes call: the ``--dry-run`` of a recipe and the stop-token derivation."""
