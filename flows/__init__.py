"""Prefect flows: they compose library calls into visible, retryable tasks; the library decides."""
