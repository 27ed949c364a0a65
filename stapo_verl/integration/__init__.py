"""The only code that touches verl's private API: one subpackage per verl release the plugin backports to
(:mod:`.verl_0_9_1`: its ledger, its version gate, its installer)."""
