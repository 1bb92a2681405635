"""The report's tables say what their numbers are: the optimizer steps each cut held, the verdict's MDE in the
order its header names, its units and n, and how the movement table folds the seeds."""

from __future__ import annotations

from centralrl.report import spending_section


def test_the_spending_table_shows_the_optimizer_steps_a_cut_held():
    # 8 rollout steps, the 6th with no informative group (skipped): cut at step 8 after 7 updates
    from centralrl.rl.run import spending

    history = [
        {"skipped": float(step == 6), "trained_tokens.central": 10.0, "flops.generation": 1e9, "flops.update": 2e9}
        for step in range(1, 9)
    ]
    spent = {k: v for k, v in spending(history, 0.0).items() if k != "wall_seconds"}
    cell = {"step": 8, "reached": False, "spent": spent}
    result = {"backbones": {"main": {"budgets": {"equal_steps": {"arms": {"joint": {"seeds": {"0": cell}}}}}}}}
    table = "\n".join(spending_section(result))
    assert "| cut at step | optimizer steps | budget reached |" in table
    assert "| main | equal_steps | joint | 0 | 8 | 7 | no | 80 | 2.4e+10 |" in table
