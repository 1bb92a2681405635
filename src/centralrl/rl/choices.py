"""The names GRPO's params may take, in a module free of torch so that `config.py` can import them cheaply.

`centralrl.rl.grpo` implements each one: the loss normalizations in `aggregate` / `batch_denominator`, the
learning-rate schedules in `lr_multiplier`; `centralrl.rl.trainer.Trainer.draws` the question samplings.
"""

LOSS_MODES = ("token", "sequence")
LR_SCHEDULES = ("constant", "linear", "cosine")
QUESTION_SAMPLINGS = ("stratified", "uniform")
