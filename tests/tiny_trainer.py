"""A one-parameter model under transformers' Trainer with the lab's callbacks and progress (lab.train.callbacks):
what tests/test_console.py trains in-process and tests/test_notebooks.py trains inside a Jupyter kernel."""

from __future__ import annotations


def tiny_trainer(out: str, steps: int = 4):
    import torch
    from transformers import Trainer, TrainingArguments

    from lab.train.callbacks import trainer_callbacks, use_text_progress

    class Line(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x, labels=None):
            return {"loss": ((self.w * x - labels) ** 2).mean()}

    data = [{"x": torch.tensor([1.0]), "labels": torch.tensor([2.0])}] * 8
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=2, logging_steps=2,
                             report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=False)
    trainer = Trainer(model=Line(), args=args, train_dataset=data, callbacks=trainer_callbacks(None, 0))
    use_text_progress(trainer)
    return trainer
