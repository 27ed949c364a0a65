"""Megatron-engine pieces of the STAPO plugin (megatron-core is imported lazily, only by verl's engine)."""
