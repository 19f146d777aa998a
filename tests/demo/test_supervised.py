"""The one supervised loop: padded batches with the loss on the targets only, AdamW steps, early stop."""

import torch

from trl_ftis.demo.supervised import pad_supervised_batch, supervised_steps
from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama


def test_padded_batch_has_labels_on_the_targets_only():
    batch = pad_supervised_batch([([1, 2], [3, 4]), ([5], [6])], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4], [-100, 6, -100, -100]]


def test_steps_lower_the_loss_and_stop_when_asked():
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1)
    encode = tokenizer.convert_tokens_to_ids
    example = ([encode(c) for c in "12+34="], [encode("4"), encode("6"), tokenizer.eos_token_id])
    losses = []

    def on_step(step, loss):
        losses.append(loss)
        model.eval()  # e.g. an evaluation: the loop puts the model back in train mode
        return step == 20

    taken, last = supervised_steps(model, ([example] * 4 for _ in range(100)), lr=1e-2, pad_id=0, on_step=on_step)
    assert taken == 20 and last == losses[-1] and model.training
    assert losses[-1] < losses[0] / 2
    assert supervised_steps(model, [], lr=1e-2, pad_id=0) == (0, None)
    assert all(p.grad is None or not torch.any(p.grad) for p in model.parameters())  # gradients cleared
