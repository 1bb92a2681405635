"""GRPO for the trainable roles: tensor pieces (`grpo`), outcome rewards (`rewards`), one step (`trainer`), one run
(`run`) and its saved state (`checkpoint`), and the supervised warm start before it (`warmstart`)."""
