"""Per-optimizer-mini-batch work of the plugin besides the mask itself: the current policy's statistics
(``stats_source=current_minibatch``) and the silenced-token dump."""
