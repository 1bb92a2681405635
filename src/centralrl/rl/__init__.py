"""GRPO for the trainable roles: outcome rewards (`rewards`) and advantage, loss and KL tensor functions (`grpo`)."""
