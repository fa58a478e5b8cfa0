"""The training steps of 02_sft and 03_grpo as their recipes run them (lab.recipes.sft, lab.recipes.grpo), keeping
the trained model for the tests to inspect (the recipes let go of it): what tests of training call."""

from __future__ import annotations


def sft_train(cfg, stage, puzzles, model=None, tokenizer=None):
    """LoRA attached, examples made, SFT trained, its outputs written into `stage`'s folder:
    (metrics, peft_model, tokenizer, step log)."""
    from lab.recipes import common
    from lab.train import checkpoints, sft

    lora = sft.model_with_lora(cfg, model, tokenizer)
    examples = sft.training_examples(cfg, lora[1], puzzles)
    result = sft.train(cfg, lora, examples, stage.checkpoint_dir,
                       resume_asked=checkpoints.asked_to_resume(stage.overrides, "sft.resume"))
    return common.save_training(stage, result, "sft"), result.model, result.tokenizer, result.log


def grpo_train(cfg, stage, puzzles, model, tokenizer):
    """The GRPO run opened, pass rates, the prompts kept and ordered, GRPO trained, its outputs written into
    `stage`'s folder: (metrics, model, step log)."""
    from lab.recipes import grpo as recipe
    from lab.train import checkpoints, grpo

    run = grpo.GrpoRun(cfg, puzzles, model, tokenizer, stage.checkpoint_dir,
                       resume_asked=checkpoints.asked_to_resume(stage.overrides, "grpo.resume"))
    rates = recipe.pass_rates(stage, run)
    recipe.prompt_order(stage, run, rates, recipe.drop_solved(stage, run, rates))
    result = run.train()
    return recipe.save_trained(stage, result), result.model, result.log
