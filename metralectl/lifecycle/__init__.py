"""Serving lifecycle: launch, wait until really ready, stop, swap with rollback. Never prints."""
