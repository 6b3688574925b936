"""Progress that survives a crash: the checkpoint file (:mod:`.store`): versioned JSON, written atomically,
never ahead of what the sink acknowledged."""
