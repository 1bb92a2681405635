"""The central-agent harness (and the single-agent reference): prompts, protocol, batched episodes."""
